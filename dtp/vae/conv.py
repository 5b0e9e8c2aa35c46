"""Convolutions on row strips: each rank computes exactly its own output rows of the untiled convolution.

y = conv(pad(x)) along the height: rank r's output rows [o0, o1) read the input rows
[o0 * s - pad_top, (o1 - 1) * s + d * (k - 1) + 1 - pad_top) (`strips.conv_rows`). The rows it lacks come
from its neighbours (`halo.exchange`); rows outside the image are the conv's zero padding, added
only at the image's top (rank 0) and bottom (last rank). The width is untouched: padded as the conv would.
So no seams, no overlap blending: the strips are the same rows the one-process conv computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .halo import exchange, halo_counts
from .split import Split
from .strips import conv_rows


def with_halo(x: torch.Tensor, dim: int, split: Split, *, kernel: int, stride: int, dilation: int, pads) -> tuple:
    """`x` extended along `dim` to exactly the input rows this rank's output rows read, and the zero rows
    (top, bottom) still to add; `pads` = (pad_top, pad_bottom) of the untiled conv."""
    in_bounds = split.bounds(x.shape[dim])
    rows = [
        conv_rows(in_bounds, q, kernel=kernel, stride=stride, dilation=dilation, pad_top=pads[0], pad_bottom=pads[1])
        for q in range(split.world)
    ]
    needs = [halo_counts(r) for r in rows]
    x = exchange(x, dim, needs, split.group, split.rank)
    mine, (got_top, got_bottom) = rows[split.rank], needs[split.rank]
    # A negative halo: the window starts (ends) inside this rank's own strip; drop those rows.
    start = max(0, -mine.top)
    stop = x.shape[dim] - max(0, -mine.bottom)
    x = x.narrow(dim, start, stop - start)
    # What the neighbours did not send is outside the image: the conv's zero padding.
    return x, (max(0, mine.top) - got_top, max(0, mine.bottom) - got_bottom)


def conv2d_rows(x: torch.Tensor, conv: nn.Conv2d, split: Split, *, row_pad=None, width_pad=None) -> torch.Tensor:
    """`conv(x)` for a (B, C, h, W) strip: this rank's output rows of the untiled convolution.

    row_pad / width_pad: (before, after) zero padding of the untiled conv when it is not the conv's
    own symmetric `padding` (AutoencoderKL's Downsample2D pads (0, 1) on both axes, then convolves with padding 0).
    """
    pad_h, pad_w = conv.padding
    x, (zeros_top, zeros_bottom) = with_halo(
        x,
        2,
        split,
        kernel=conv.kernel_size[0],
        stride=conv.stride[0],
        dilation=conv.dilation[0],
        pads=row_pad or (pad_h, pad_h),
    )
    left, right = width_pad or (pad_w, pad_w)
    x = F.pad(x, (left, right, zeros_top, zeros_bottom))
    return F.conv2d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)
