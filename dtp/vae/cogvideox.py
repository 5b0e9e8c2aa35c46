"""AutoencoderKLCogVideoX (CogVideoX, CogVideoX-Fun, ConsisID) on row strips: (B, C, T, H, W), the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_cogvideox.py`, `downsampling.py`, `upsampling.py`) and why each is exact:
- CogVideoXCausalConv3d (pad_mode "first" / "constant"): time padded with the conv cache or the first frame
  repeated, then CogVideoXSafeConv3d (an nn.Conv3d) with zero padding (0, k_h // 2, k_w // 2): the inner conv takes
  the Conv3d strip rule (halo rows, zeros at the image's edges). The cache it returns is the strip's last frames,
  which the next frame batch's strip needs (every frame batch splits the same latent rows).
- GroupNorm (resnets, the encoder's norm_out, the spatial norms' norm_layer): the whole frame batch's statistics
  (`norm.py`), as the untiled decode normalises each frame batch it is called on.
- CogVideoXSpatialNorm3D: the latent zq (the decoder's input: this rank's latent rows) nearest-interpolated to the
  activation's size, then 1 x 1 x 1 convs: output row o reads zq row floor(o / s) at an s x finer grid, and every
  strip bound there is s x its latent bound, so each strip interpolates its own rows (s is a power of 2: the scale
  H_zq / H_f is exact in floating point, on the strip as on the whole).
- CogVideoXUpsample3D: nearest x2 (time too when compress_time) then a 3 x 3 Conv2d per frame: row-local, then the
  Conv2d strip rule. CogVideoXDownsample3D: time averaged per position (row-local), then F.pad(0, 1, 0, 1) and a
  stride-2 Conv2d with no padding: on a strip the padded bottom row is the image's only on the last rank, so its
  conv drops that row and reads its real bottom rows from the neighbour below (`conv2d_rows`, bottom zero row at
  the image's edge only).
- The encoder's / decoder's (sample, conv cache) output: the parallel entry gathers the sample (`apply._entry`).
Mochi's replicate-padded use of the causal conv has its own rule (`mochi.py`, first in the table). Refused: a causal
conv with a stride in H.
"""

from __future__ import annotations

from torch import nn

from .conv import conv2d_rows
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check

KINDS = {
    "CogVideoXCausalConv3d": "causal_conv",
    "CogVideoXSpatialNorm3D": "spatial_norm",
    "CogVideoXDownsample3D": "downsample",
    "CogVideoXUpsample3D": "upsample",
}


def check(module: nn.Module, kind: str) -> str | None:
    """Why a CogVideoX layer has no strip rule (None when it has one)."""
    if kind == "causal_conv":
        if module.pad_mode == "replicate":
            return "pad_mode='replicate' (the strip rule covers the first-frame / cache padding only)"
        if module.conv.stride[1] != 1:
            return f"stride {module.conv.stride} in H (only time strides)"
    if kind == "downsample" and (module.conv.padding_mode != "zeros" or module.conv.padding != (0, 0)):
        conv = module.conv
        return f"a conv padded {conv.padding} ({conv.padding_mode}) after diffusers' (0, 1, 0, 1) pad (only 0)"
    return None


def _install_downsample(module: nn.Module, state: VaeParallel) -> None:
    conv = module.conv

    def strip_conv(x):
        # x: the (B T, C, h + 1, W + 1) strip diffusers padded; its last row is zeros, the image's bottom only on the
        # last rank: dropped, and the conv's (0, 1) row padding taken over the whole image instead.
        return conv2d_rows(x.narrow(2, 0, x.shape[2] - 1), conv, state.split, row_pad=(0, 1))

    state.replace(conv, strip_conv)


def _rule(class_name: str, **fields) -> StripRule:
    kind = KINDS[class_name]
    return StripRule(class_name, by_class_name(class_name), reason_check(lambda m: check(m, kind)), **fields)


# The causal conv's inner Conv3d, the spatial norm's GroupNorm and convs and the upsampler's Conv2d are visited and
# take their own rules; the downsampler runs its conv itself.
RULES = (
    _rule("CogVideoXCausalConv3d"),
    _rule("CogVideoXSpatialNorm3D"),
    _rule(
        "CogVideoXDownsample3D",
        install=_install_downsample,
        owns=lambda m: ("",),
        height_stride=lambda m: m.conv.stride[0],
    ),
    _rule("CogVideoXUpsample3D"),
)
