"""AutoencoderKLMagvit (EasyAnimate) on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_magvit.py`) and why each is exact:
- EasyAnimateCausalConv3d: an nn.Conv3d (zero padding (0, p_h, p_w)) whose forward pads time (the first frame
  repeated, or its `prev_features` cache of the last call's frames) and runs `nn.Conv3d.forward` on each window of
  k_t frames. Only the window's conv touches rows: its `_conv_forward` is replaced by the strip conv (halo rows,
  zeros at the image's edges; `conv.conv3d_rows`), so diffusers' own time logic runs unchanged and the cache holds
  this rank's rows (every call of a decode splits the same latent rows). One halo exchange per window.
- EasyAnimateDownsampler3D: F.pad(0, 1, 0, 1) then a causal conv with stride 2 in H and no padding: on a strip the
  padded bottom row is the image's only on the last rank, so each window's conv drops that row and reads its real
  bottom rows from the neighbour below (zero row at the image's edge only). Height stride 2.
- EasyAnimateUpsampler3D: nearest x2 in (H, W) (row-local), its causal conv, then a time-only interpolation.
- GroupNorm (spatial_group_norm: per frame over (H, W), else over (T, H, W)): the whole image's statistics
  (`norm.py`), whichever positions the untiled norm reduces over; 1 x 1 x 1 shortcut convs and activations: per row.
Refused: a causal conv with a stride in H outside a downsampler, or padded other than with zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .conv import conv3d_rows, rows_for_conv
from .split import Split
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check

CAUSAL_CONV, DOWNSAMPLER = "EasyAnimateCausalConv3d", "EasyAnimateDownsampler3D"


def _check_causal_conv(conv: nn.Module) -> str | None:
    if conv.padding_mode != "zeros" or conv.stride[1] != 1:
        return f"padding_mode={conv.padding_mode!r}, stride {conv.stride} (zeros and no H stride outside a downsampler)"
    return None


def _check_downsampler(down: nn.Module) -> str | None:
    conv = down.conv
    if conv.padding_mode != "zeros" or conv.padding[1] != 0 or conv.stride[1] not in (1, 2):
        return f"a conv with padding {conv.padding} ({conv.padding_mode}), stride {conv.stride} after (0, 1, 0, 1)"
    return None


def _install_causal_conv(conv: nn.Module, state: VaeParallel) -> None:
    state.replace(conv, lambda x, weight, bias: conv3d_rows(x, conv, state.split), name="_conv_forward")


def padded_strip_conv3d(x: torch.Tensor, conv: nn.Conv3d, split: Split) -> torch.Tensor:
    """The downsampler's conv on a (B, C, t, h + 1, W + 1) strip that diffusers' F.pad(0, 1, 0, 1) extended: this
    rank's output rows of the whole image's padded conv (its last row dropped, the (0, 1) row padding image-wide)."""
    x = x.narrow(3, 0, x.shape[3] - 1)
    geometry = dict(kernel=conv.kernel_size[1], stride=conv.stride[1], dilation=conv.dilation[1])
    x = rows_for_conv(x, 3, split, **geometry, pads=(0, 1))
    padding = (conv.padding[0], 0, conv.padding[2])
    return F.conv3d(x, conv.weight, conv.bias, conv.stride, padding, conv.dilation, conv.groups)


def _install_downsampler(down: nn.Module, state: VaeParallel) -> None:
    conv = down.conv
    state.replace(conv, lambda x, weight, bias: padded_strip_conv3d(x, conv, state.split), name="_conv_forward")


# Before the generic Conv3d rule (`image.py`): an EasyAnimateCausalConv3d is an nn.Conv3d. The downsampler runs its
# conv itself (owns it); the upsampler and the blocks are containers of rows-local code around their layers.
RULES = (
    StripRule(
        DOWNSAMPLER,
        by_class_name(DOWNSAMPLER),
        reason_check(_check_downsampler),
        install=_install_downsampler,
        owns=lambda m: ("",),
        height_stride=lambda m: m.conv.stride[1],
    ),
    StripRule(CAUSAL_CONV, by_class_name(CAUSAL_CONV), reason_check(_check_causal_conv), install=_install_causal_conv),
)
