"""Convolutions on row strips: each rank computes exactly its own output rows of the untiled convolution.

y = conv(pad(x)) along the height: rank r's output rows [o0, o1) read the input rows
[o0 * s - pad_top, (o1 - 1) * s + d * (k - 1) + 1 - pad_top) (`strips.conv_rows`). The rows it lacks come
from its neighbours (`halo.neighbour_rows`); rows outside the image are the conv's zero padding, added
only at the image's top (rank 0) and bottom (last rank). The width is untouched: padded as the conv would.
So no seams, no overlap blending: the strips are the same rows the one-process conv computes.

Two ways to compute it, same result:
- `same` convs (stride 1, output height = input height, e.g. every 3x3 conv with padding 1): the
  strip is convolved as is with the conv's own zero padding, then the p rows at each inner strip
  edge, which saw zeros instead of the neighbour's rows, are recomputed from [halo | 2p own rows] and
  written in place. Peak memory: input + output, as the untiled conv (no padded copy of the strip).
- anything else (stride 2 downsampling, asymmetric padding): the strip with its halo and zero rows
  concatenated, then convolved without height padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .halo import halo_counts, neighbour_rows
from .split import Split
from .strips import conv_rows


def conv2d_rows(x: torch.Tensor, conv: nn.Conv2d, split: Split, *, row_pad=None, width_pad=None) -> torch.Tensor:
    """`conv(x)` for a (B, C, h, W) strip: this rank's output rows of the untiled convolution.

    row_pad / width_pad: (before, after) zero padding of the untiled conv when it is not the conv's
    own symmetric `padding` (AutoencoderKL's Downsample2D pads (0, 1) on both axes, then convolves with padding 0).
    """
    pad_h, pad_w = conv.padding
    row_pad = row_pad or (pad_h, pad_h)
    width_pad = width_pad or (pad_w, pad_w)
    kernel, stride, dilation = conv.kernel_size[0], conv.stride[0], conv.dilation[0]
    same = stride == 1 and row_pad == (pad_h, pad_h) and dilation * (kernel - 1) == 2 * pad_h
    if same and width_pad == (pad_w, pad_w) and x.shape[2] >= 2 * pad_h:
        above, below = _halo(x, 2, split, kernel, stride, dilation, row_pad)[1:]
        return _same_conv(x, conv, above, below)
    x = rows_for_conv(x, 2, split, kernel=kernel, stride=stride, dilation=dilation, pads=row_pad)
    x = F.pad(x, (*width_pad, 0, 0))
    return F.conv2d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


def rows_for_conv(
    x: torch.Tensor, dim: int, split: Split, *, kernel: int, stride: int, dilation: int, pads, edge: str = "zeros"
) -> torch.Tensor:
    """Exactly the input rows (along `dim`) this rank's output rows of the conv read: its strip with the
    neighbours' halo rows and, at the image's edges, the padding; `pads` = (pad_top, pad_bottom) of the
    untiled conv. Convolve the result with no padding along `dim`.

    edge: "zeros" (zero padding) or "replicate" (the image's first / last row repeated, as
    F.pad(mode="replicate") does; HunyuanVideo's causal convs), or "reflect" (rows mirrored about the image's
    first / last row; LTX-2's decoder convs). Replicate and reflect padding are a map of the row index,
    independent per dim, so padding the rows here and the other dims afterwards equals one F.pad.
    """
    mine, above, below = _halo(x, dim, split, kernel, stride, dilation, pads)
    # A negative halo: the window starts (ends) inside this rank's own strip; drop those rows.
    start, stop = max(0, -mine.top), x.shape[dim] - max(0, -mine.bottom)
    x = x.narrow(dim, start, stop - start)
    if edge == "reflect":
        return _reflect_rows(x, above, below, mine, dim)
    top = _zeros_then(above, max(0, mine.top), x, dim, edge)
    bottom = _then_zeros(below, max(0, mine.bottom), x, dim, edge)
    return torch.cat([t for t in (top, x, bottom) if t is not None], dim=dim)


def conv3d_rows(x: torch.Tensor, conv: nn.Conv3d, split: Split) -> torch.Tensor:
    """`conv(x)` for a (B, C, T, h, W) strip of an nn.Conv3d: this rank's output rows.

    Rows are dim 3; time and width are padded as the conv pads them (padding (p_t, p_h, p_w), its padding_mode).
    """
    pad_t, pad_h, pad_w = conv.padding
    mode = conv.padding_mode  # "zeros", or "reflect" / "replicate" (LTX-2's convs): rows padded alike at the edges
    geometry = dict(kernel=conv.kernel_size[1], stride=conv.stride[1], dilation=conv.dilation[1])
    same = geometry["stride"] == 1 and geometry["dilation"] * (geometry["kernel"] - 1) == 2 * pad_h
    if mode == "zeros" and same and 0 < 2 * pad_h <= x.shape[3]:
        above, below = _halo(x, 3, split, pads=(pad_h, pad_h), **geometry)[1:]
        return _same_conv3d(x, conv, above, below)
    x = rows_for_conv(x, 3, split, **geometry, pads=(pad_h, pad_h), edge=mode)
    if mode == "zeros":
        return F.conv3d(x, conv.weight, conv.bias, conv.stride, (pad_t, 0, pad_w), conv.dilation, conv.groups)
    x = F.pad(x, (pad_w, pad_w, 0, 0, pad_t, pad_t), mode=mode)  # what nn.Conv3d does for a non-zeros padding_mode
    return F.conv3d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


def self_padded_conv3d_rows(
    x: torch.Tensor, conv: nn.Conv3d, split: Split, padding, mode: str = "constant", cache=None
) -> torch.Tensor:
    """A causal Conv3d that pads its input itself (Wan's, HunyuanVideo's) on a (B, C, T, h, W) strip: this
    rank's output rows.

    padding = (w_left, w_right, h_top, h_bottom, t_front, t_back) as F.pad takes it, with F.pad `mode`
    ("constant" zeros or "replicate"); the inner conv has padding 0. Rows come from the neighbours' halo;
    only the image's own top and bottom edges are padded (zeros, or the edge row repeated).
    cache: frames to put before x in time (Wan's temporal cache), counted in t_front already.
    """
    w_left, w_right, h_top, h_bottom, t_front, t_back = padding
    geometry = dict(kernel=conv.kernel_size[1], stride=conv.stride[1], dilation=conv.dilation[1])
    rows = _conv_rows(x, 3, split, pads=(h_top, h_bottom), **geometry)
    mine, cached = rows[split.rank], 0 if cache is None else cache.shape[2]
    if mode == "constant" and mine.top >= 0 and mine.bottom >= 0 and cached <= t_front:
        x = _zero_padded_strip(x, split, rows, padding, cache)
    else:
        if cache is not None:
            x = torch.cat([cache, x], dim=2)
            t_front -= cache.shape[2]
        edge = "replicate" if mode == "replicate" else "zeros"
        x = rows_for_conv(x, 3, split, **geometry, pads=(h_top, h_bottom), edge=edge)
        x = F.pad(x, (w_left, w_right, 0, 0, t_front, t_back), mode=mode)
    return F.conv3d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


def _zero_padded_strip(x: torch.Tensor, split: Split, rows: list, padding, cache=None) -> torch.Tensor:
    """[cache | x] (B, C, T, h, W) zero-padded in time and width, with its halo rows, in ONE new tensor.

    Equal to F.pad(rows_for_conv(torch.cat([cache, x], 2), ...), (w_left, w_right, 0, 0, t_zeros, t_back))
    without the two intermediate copies (time-extended, row-extended): at the decode's peak (Wan's last frame
    chunk, full resolution) each is a whole strip. Rows: [zeros_top | from above | own rows | from below |
    zeros_bottom]; the own rows are written first and the neighbours' halo is sent from them.
    """
    w_left, w_right, h_top, h_bottom, t_front, t_back = padding
    mine = rows[split.rank]
    cached = 0 if cache is None else cache.shape[2]
    batch, channels, frames, own, width = x.shape
    shape = (batch, channels, t_front + frames + t_back, mine.top + own + mine.bottom, w_left + width + w_right)
    out = x.new_zeros(shape)
    inner = out.narrow(2, t_front - cached, cached + frames).narrow(4, w_left, width)
    strip = inner.narrow(3, mine.top, own)
    strip.narrow(2, cached, frames).copy_(x)
    if cache is not None:
        strip.narrow(2, 0, cached).copy_(cache)
    above, below = neighbour_rows(strip, 3, [halo_counts(r) for r in rows], split.group, split.rank)
    if above is not None:
        inner.narrow(3, mine.top - above.shape[3], above.shape[3]).copy_(above)
    if below is not None:
        inner.narrow(3, mine.top + own, below.shape[3]).copy_(below)
    return out


def _conv_rows(x: torch.Tensor, dim: int, split: Split, *, kernel: int, stride: int, dilation: int, pads) -> list:
    """Every rank's ConvRows for a conv along `dim` of a strip `x`."""
    in_bounds = split.bounds(x.shape[dim])
    geometry = dict(kernel=kernel, stride=stride, dilation=dilation, pad_top=pads[0], pad_bottom=pads[1])
    return [conv_rows(in_bounds, q, **geometry) for q in range(split.world)]


def _halo(x: torch.Tensor, dim: int, split: Split, kernel: int, stride: int, dilation: int, pads) -> tuple:
    """(this rank's ConvRows, rows from the rank above, rows from the rank below) for a conv along `dim`."""
    rows = _conv_rows(x, dim, split, kernel=kernel, stride=stride, dilation=dilation, pads=pads)
    above, below = neighbour_rows(x, dim, [halo_counts(r) for r in rows], split.group, split.rank)
    return rows[split.rank], above, below


def _same_conv(x: torch.Tensor, conv: nn.Conv2d, above, below) -> torch.Tensor:
    """A stride-1 'same' conv on a strip: zero-padded conv of the strip, inner edges recomputed in place.

    Output row o reads input rows [o - p, o + p]; rows [0, p) of the strip's output therefore need
    the p rows above it: recomputed from [above | x[:2p]] (3p rows in, p rows out), and likewise at the
    bottom from [x[-2p:] | below].
    """
    p = conv.padding[0]
    out = F.conv2d(x, conv.weight, conv.bias, 1, conv.padding, conv.dilation, conv.groups)
    if p == 0:
        return out
    if above is not None:
        edge = torch.cat([_zeros_then(above, p, x, 2), x[:, :, : 2 * p]], dim=2)
        out[:, :, :p] = _valid_rows(edge, conv)
    if below is not None:
        edge = torch.cat([x[:, :, -2 * p :], _then_zeros(below, p, x, 2)], dim=2)
        out[:, :, -p:] = _valid_rows(edge, conv)
    return out


def _same_conv3d(x: torch.Tensor, conv: nn.Conv3d, above, below) -> torch.Tensor:
    """`_same_conv` for a (B, C, T, h, W) strip of a zero-padded, stride-1 'same' nn.Conv3d (rows: dim 3).

    No [halo | strip | halo] copy of the whole strip: at Magvit's full-resolution windows that copy was the excess of
    its per-rank decode peak over 1/N (0.129x at N = 8)."""
    p = conv.padding[1]
    out = F.conv3d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)
    valid = (conv.padding[0], 0, conv.padding[2])
    if above is not None:
        edge = torch.cat([_zeros_then(above, p, x, 3), x[:, :, :, : 2 * p]], dim=3)
        out[:, :, :, :p] = F.conv3d(edge, conv.weight, conv.bias, conv.stride, valid, conv.dilation, conv.groups)
    if below is not None:
        edge = torch.cat([x[:, :, :, -2 * p :], _then_zeros(below, p, x, 3)], dim=3)
        out[:, :, :, -p:] = F.conv3d(edge, conv.weight, conv.bias, conv.stride, valid, conv.dilation, conv.groups)
    return out


def _valid_rows(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """The conv with no height padding (its own width padding)."""
    return F.conv2d(x, conv.weight, conv.bias, conv.stride, (0, conv.padding[1]), conv.dilation, conv.groups)


def _reflect_rows(x: torch.Tensor, above, below, mine, dim: int) -> torch.Tensor:
    """[above | x | below] with the image's own edge rows mirrored on (F.pad mode="reflect" along `dim`).

    Padded row -k is image row k, and row H - 1 + k is row H - 1 - k: at the top / bottom strip these are rows of
    the window itself, which starts (ends) at the image's edge there. A halo row a neighbour did not send (only
    under a negative control) is zeros, as in the zeros path.
    """
    top = _zeros_then(above, max(0, mine.top) - mine.zeros_top, x, dim)
    bottom = _then_zeros(below, max(0, mine.bottom) - mine.zeros_bottom, x, dim)
    core = torch.cat([t for t in (top, x, bottom) if t is not None], dim=dim)
    rows = core.shape[dim]
    assert rows > max(mine.zeros_top, mine.zeros_bottom), f"{rows} rows cannot reflect {mine}"
    parts = [core.narrow(dim, 1, mine.zeros_top).flip(dim), core]
    parts.append(core.narrow(dim, rows - 1 - mine.zeros_bottom, mine.zeros_bottom).flip(dim))
    return torch.cat(parts, dim=dim)


def _zeros_then(rows, wanted: int, like: torch.Tensor, dim: int, edge: str = "zeros"):
    """`wanted` rows ending with the received `rows`: what a neighbour did not send is outside the image
    (zeros, or the image's first row repeated: the first of `rows`, else of the strip `like`)."""
    got = 0 if rows is None else rows.shape[dim]
    if wanted == got:
        return rows
    first = (like if rows is None else rows).narrow(dim, 0, 1)
    pad = _padding(first, like, dim, wanted - got, edge)
    return pad if rows is None else torch.cat([pad, rows], dim=dim)


def _then_zeros(rows, wanted: int, like: torch.Tensor, dim: int, edge: str = "zeros"):
    """`wanted` rows starting with the received `rows`, padding after (the image's bottom: zeros or its last row)."""
    got = 0 if rows is None else rows.shape[dim]
    if wanted == got:
        return rows
    last = like.narrow(dim, like.shape[dim] - 1, 1) if rows is None else rows.narrow(dim, rows.shape[dim] - 1, 1)
    pad = _padding(last, like, dim, wanted - got, edge)
    return pad if rows is None else torch.cat([rows, pad], dim=dim)


def _padding(row: torch.Tensor, like: torch.Tensor, dim: int, count: int, edge: str) -> torch.Tensor:
    if edge == "replicate":
        return row.expand(_shape(like, dim, count))
    assert edge == "zeros", edge
    return like.new_zeros(_shape(like, dim, count))


def _shape(x: torch.Tensor, dim: int, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] = rows
    return shape
