"""AutoencoderKLMochi (Mochi 1) on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_mochi.py`) and why each is exact on strips:
- CogVideoXCausalConv3d with pad_mode="replicate" (every conv of Mochi's resnets and down blocks):
  F.pad(x, (k_w // 2, k_w // 2, k_h // 2, k_h // 2, k_t - 1, 0), mode="replicate"), then the inner conv with padding 0
  (stride 2 in H for the down blocks' k = s = 2 patch convs), no conv cache. HunyuanVideo's causal conv does the
  same: on a strip the halo rows of the neighbours, and at the image's top / bottom its first / last row repeated
  (`conv.self_padded_conv3d_rows`; replicate is a per-dim index clamp, so rows padded here and time / width afterwards
  equal one F.pad).
- MochiChunkedGroupNorm3D: an nn.GroupNorm per frame (frames folded into the batch, in chunks of 8 frames): a
  container whose GroupNorm takes the generic rule, the whole frame's statistics for each folded sample (every rank
  folds the same frames into the same chunks, so the all_gathers pair up).
- Attention with MochiVaeAttnProcessor2_0 (the encoder's down / mid blocks): one sequence per pixel, its tokens the
  frames ((B H W, T, C), causal over frames): row-local, nothing to exchange.
- FourierFeatures, the Linear projections (proj_in / proj_out, the up blocks' proj), the up blocks' depth-to-space
  unpatchify (latent row h -> rows [h s, h s + s)): per position or row-local.
Refused: a replicate-padded causal conv with a stride in H other than its kernel (a window straddling strips), and
framewise decoding (`_enable_framewise_decoding` switches the convs to constant padding with no H / W padding at all;
ForwardError at the call).
"""

from __future__ import annotations

from torch import nn

from ..errors import ForwardError
from .conv import self_padded_conv3d_rows
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check


def is_replicate_conv(module: nn.Module) -> bool:
    """Mochi's use of CogVideoX's causal conv (CogVideoX's own, constant padding, stays with `cogvideox.py`)."""
    return type(module).__name__ == "CogVideoXCausalConv3d" and module.pad_mode == "replicate"


def check_causal_conv(module: nn.Module) -> str | None:
    """Why a replicate-padded causal conv has no strip rule (None when it has one)."""
    conv = module.conv
    if tuple(conv.padding) != (0, 0, 0) or conv.dilation[1] != 1:
        return (
            f"pad_mode='replicate' with an inner conv padding {conv.padding}, dilation {conv.dilation} (Mochi's: 0, 1; "
            f"a conv built for constant padding pads twice)"
        )
    if conv.stride[1] not in (1, conv.kernel_size[1]):
        return f"kernel {conv.kernel_size} with stride {conv.stride} in H (only 1, or the kernel's: patches)"
    return None


def causal_conv_rows(module: nn.Module, x, split, conv_cache=None):
    """CogVideoXCausalConv3d.forward (replicate) on a (B, C, T, h, W) strip: (this rank's output rows, None)."""
    if module.pad_mode != "replicate":
        raise ForwardError(
            "parallel VAE: Mochi's causal conv was split with replicate padding; framewise decoding / encoding "
            "changed it afterwards. Call remove_vae_parallel(vae) before switching modes, then parallelize again."
        )
    return self_padded_conv3d_rows(x, module.conv, split, module.time_causal_padding, "replicate"), None


def _install_causal_conv(module: nn.Module, state: VaeParallel) -> None:
    state.replace(module, lambda x, conv_cache=None: causal_conv_rows(module, x, state.split, conv_cache))


def is_frame_attention(module: nn.Module) -> bool:
    """An Attention run by MochiVaeAttnProcessor2_0: attention over frames, one sequence per pixel."""
    processor = getattr(module, "processor", None)
    return type(module).__name__ == "Attention" and type(processor).__name__ == "MochiVaeAttnProcessor2_0"


RULES = (
    StripRule(
        "CogVideoXCausalConv3d (replicate, Mochi)",
        is_replicate_conv,
        reason_check(check_causal_conv),
        install=_install_causal_conv,
        owns=lambda m: ("",),  # its inner conv is run by `causal_conv_rows`
        height_stride=lambda m: m.conv.stride[1],
    ),
    StripRule("Attention (MochiVaeAttnProcessor2_0)", is_frame_attention, owns=lambda m: ("",)),
    StripRule("FourierFeatures", by_class_name("FourierFeatures")),
)
