"""AutoencoderKLLTXVideo on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_ltx.py`) and why each is exact on strips:
- LTXVideoCausalConv3d: frames padded by repeating the first (and last) frame (time is not split), then an
  nn.Conv3d with zero padding (0, k_h // 2, k_w // 2), stride 2 in (T, H, W) for the 0.9.0 downsampling:
  the inner Conv3d takes the strip conv rule (`conv.conv3d_rows`: halo rows, zeros at the image's edges).
- RMSNorm / LayerNorm: applied channel-last (`movedim(1, -1)`) over the channels of each position: row-local.
- LTXVideoDownsampler3d / LTXVideoUpsampler3d and the encoder's patchify / decoder's unpatchify: space-to-depth
  and depth-to-space by a factor f (2, or the patch size) in H; strip bounds are multiples of f at every
  grid (`strips.py`), so each strip maps to whole rows: row-local.
- Timestep conditioning (PixArtAlphaCombinedTimestepSizeEmbeddings, scale_shift_table): acts on the timestep,
  the same on every rank.
- Refused: inject_noise (decoder_inject_noise): `torch.randn(H, W)` drawn per call over the whole image; a
  strip would draw another stream, not its rows of the untiled noise.
"""

from __future__ import annotations

from torch import nn

from .strip_rule import StripRule, reason_check

KINDS = {
    "LTXVideoCausalConv3d": "causal_conv",
    "LTXVideoResnetBlock3d": "resnet",
    "LTXVideoDownsampler3d": "downsampler",
    "LTXVideoUpsampler3d": "upsampler",
    "PixArtAlphaCombinedTimestepSizeEmbeddings": "timestep",
    # LTX-2's (autoencoder_kl_ltx2.py): the same math under new names; its causal conv has its own rule (ltx2.py).
    "LTX2VideoResnetBlock3d": "resnet",
    "LTX2VideoDownsampler3d": "downsampler",
    "LTX2VideoUpsampler3d": "upsampler",
}
PATCHIFY_ENCODERS = ("LTXVideoEncoder3d", "LTX2VideoEncoder3d")  # encoders that patchify their input (patch_factor)
# Channel-last norms inside LTX blocks (normalized over the channels of one position).
CHANNEL_NORMS = ("RMSNorm", "LayerNorm")


def layer_kind(module: nn.Module) -> str | None:
    """'causal_conv', 'resnet', 'downsampler', 'upsampler', 'timestep', 'channel_norm' for an LTX VAE layer."""
    name = type(module).__name__
    if name in CHANNEL_NORMS:
        return "channel_norm"
    return KINDS.get(name)


def check(module: nn.Module, kind: str) -> str | None:
    """Why an LTX layer has no strip rule (None when it has one)."""
    if kind == "resnet" and module.per_channel_scale1 is not None:
        return "inject_noise (spatial noise drawn over the whole (H, W) each call: a strip draws other numbers)"
    if kind == "causal_conv" and module.conv.padding_mode != "zeros":
        return f"padding_mode={module.conv.padding_mode!r} (only zeros is split)"
    if kind in ("downsampler", "upsampler") and module.stride[1] not in (1, 2):
        return f"stride {module.stride} in H (only 1 or 2 keeps whole rows per strip)"
    if kind == "channel_norm":
        shape = getattr(module, "normalized_shape", None) or getattr(module, "dim", None)
        if shape is None or len(tuple(shape)) != 1:
            return f"normalized shape {shape} (only the channels of one position are row-local)"
    return None


def height_stride(module: nn.Module) -> int:
    """The factor by which a layer divides the height: the downsampling conv's or Downsampler3d's H stride."""
    kind = layer_kind(module)
    if kind == "causal_conv":
        return module.conv.stride[1]
    if kind == "downsampler":
        return module.stride[1]
    return 1


def patch_factor(part: nn.Module) -> int:
    """The encoder's patchify factor in H (its input rows per row of its first activation)."""
    return getattr(part, "patch_size", 1)


def _rule(kind: str, **fields) -> StripRule:
    def matches(module: nn.Module) -> bool:
        return layer_kind(module) == kind

    return StripRule(f"LTX {kind}", matches, reason_check(lambda module: check(module, kind)), **fields)


# Nothing to install: LTX's causal conv pads time itself and leaves H to its inner nn.Conv3d (the Conv3d rule);
# the other layers are row-local. The timestep embedder's subtree acts on the timestep, not on rows.
RULES = (
    _rule("causal_conv", height_stride=height_stride),
    _rule("resnet"),
    _rule("downsampler", height_stride=height_stride),
    _rule("upsampler"),
    _rule("timestep", owns=lambda m: ("",)),
    _rule("channel_norm"),
)
