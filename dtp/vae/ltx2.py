"""AutoencoderKLLTX2Video (LTX-2) on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

LTX-2's VAE is LTX-Video 0.9.5's layout with new layers (diffusers `autoencoder_kl_ltx2.py`). Its resnet, space-to-
depth Downsampler3d and depth-to-space Upsampler3d do LTX's math under new names: they take `ltx.py`'s rules (listed
in `ltx.KINDS`), as do its timestep embedder and the shortcut's channel LayerNorm. What differs, and is here:
- LTX2VideoCausalConv3d: frames padded by repeating the first (and, non-causal, the last) frame (time is not
  split), then an nn.Conv3d whose H and W padding has a `spatial_padding_mode`: zeros in the encoder, **reflect**
  in the released decoder. On a strip: halo rows from the neighbours, the image's own rows mirrored at its top and
  bottom edge only (`conv.conv3d_rows` with edge="reflect"); W and T padded as the conv pads them. Circular padding
  would wrap the image's last row onto its first (a whole-height op): refused.
- PerChannelRMSNorm: x / sqrt(mean(x^2 over channels) + eps) at each position: row-local.
"""

from __future__ import annotations

from torch import nn

from .conv import conv3d_rows
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check

PADDING_MODES = ("zeros", "reflect", "replicate")  # nn.Conv3d padding modes a strip reproduces at the image's edges


def check_causal_conv(module: nn.Module) -> str | None:
    """Why an LTX2VideoCausalConv3d has no strip rule (None when it has one)."""
    mode = module.conv.padding_mode
    if mode not in PADDING_MODES:
        return f"spatial_padding_mode={mode!r} (wraps the image's last row onto its first; split: {PADDING_MODES})"
    return None


def check_norm(module: nn.Module) -> str | None:
    """Why a PerChannelRMSNorm is not row-local (None when it is)."""
    return None if module.channel_dim == 1 else f"channel_dim={module.channel_dim} (only the channels, dim 1)"


def _install_causal_conv(module: nn.Module, state: VaeParallel) -> None:
    # The causal conv pads time itself, then calls its inner nn.Conv3d: that conv runs on the strip.
    conv = module.conv
    state.replace(conv, lambda x: conv3d_rows(x, conv, state.split))


RULES = (
    StripRule(
        "LTX2VideoCausalConv3d",
        by_class_name("LTX2VideoCausalConv3d"),
        reason_check(check_causal_conv),
        install=_install_causal_conv,
        owns=lambda m: ("",),  # runs its inner nn.Conv3d itself
        height_stride=lambda m: m.conv.stride[1],
    ),
    StripRule("PerChannelRMSNorm", by_class_name("PerChannelRMSNorm"), reason_check(check_norm)),
)
