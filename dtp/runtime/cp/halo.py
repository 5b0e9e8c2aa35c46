"""Convolutions over the split token grid: halo rows from the neighbouring cp ranks (a plan's `cp.halo`).

Sana's Mix-FFN unflattens each rank's tokens to its [B, C, H / cp, W] rows of the latent grid and runs a 3 x 3
depthwise conv (padding p = 1) on them: each output row needs the p input rows above and below it, and at a rank's
first and last p rows those sit on the neighbouring ranks. The conv runs on the rank's own rows as usual (its zero
padding is right at the image's top on rank 0 and bottom on the last rank, where one process pads too, and stands
for the neighbours' rows at the seams). A forward hook then brings p rows from each neighbour (`dtp/neighbours.py`,
the exchange the parallel VAE uses) and adds what they contribute, which the zero padding left out: a conv is a
sum over its kernel rows, so output row i < p gains conv(above, kernel rows [0, p)) and row h - p + i gains
conv(below, kernel rows [p + 1, 2p + 1)), each over p rows (the rows past the halo zero, as in the padding): exact
up to the order of the sum (~1e-7). Only the 2p received rows and p output rows are extra, so the per-rank peak
stays near the one-process one / cp (a whole [above | own | below] strip adds 2p / (H / cp) to the Mix-FFN's
largest tensors: 50 % for Sana 1.6B at 1024² and cp = 8, 4 rows a rank). Example: H = 8, cp = 4, p = 1: rank 1
holds rows 2-3; row 2 gains kernel row 0 times row 1, row 3 gains kernel row 2 times row 4.
A conv split by tp as well (`styles/conv.py`) adds its halo term on its own channels: a conv whose output is gathered
(Sana-Video's `conv_temp`, conv_colwise_gathered) gathers the term's channels too (p rows, one small all-gather).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...neighbours import neighbour_rows
from ...styles.collectives import local
from ...styles.parallel import STYLE_ATTR


class ConvHalo:
    """Forward hook of one 'same' conv (p = `rows` of padding along `dim`) whose input rows are split over `cp`."""

    def __init__(self, path: str, dim: int, rows: int, group, rank: int, cp: int):
        self.path, self.dim, self.rows, self.group, self.rank = path, dim, rows, group, rank
        # rows each rank q takes from above and below: none beyond the image's edges
        self.needs = [(0 if q == 0 else rows, 0 if q == cp - 1 else rows) for q in range(cp)]

    def __call__(self, module, args, output):
        x, dim, p = args[0], self.dim, self.rows
        above, below = neighbour_rows(x, dim, self.needs, self.group, self.rank, what=f"cp halo of '{self.path}'")
        if above is not None:  # rows [0, p) gain what the rows above contribute through kernel rows [0, p)
            output.narrow(dim, 0, p).add_(_rows_term(module, above, dim, first=0, pad_after=True))
        if below is not None:  # rows [h - p, h) gain the rows below through kernel rows [p + 1, 2p + 1)
            output.narrow(dim, x.shape[dim] - p, p).add_(_rows_term(module, below, dim, first=p + 1, pad_after=False))
        return output


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _rows_term(conv: nn.Module, rows: torch.Tensor, dim: int, first: int, pad_after: bool) -> torch.Tensor:
    """What p halo `rows` add to the p output rows beside them: `conv` (no bias) with its kernel rows
    [first, first + p) along `dim`, the halo extended by p - 1 zero rows on its far side (below the rows above,
    above the rows below): output row i sums halo row i + m times kernel row first + m, zero past the halo."""
    p = rows.shape[dim]
    if p > 1:
        shape = list(rows.shape)
        shape[dim] = p - 1
        zeros = rows.new_zeros(shape)
        rows = torch.cat([rows, zeros] if pad_after else [zeros, rows], dim=dim)
    padding = list(conv.padding)
    padding[dim - 2] = 0
    weight = local(conv.weight).narrow(dim, first, p)  # [out, in / groups, *kernel]: kernel rows at the same dim
    term = _CONV[len(padding)](rows, weight, None, conv.stride, tuple(padding), conv.dilation, conv.groups)
    style = conv.__dict__.get(STYLE_ATTR)  # split by tp too (styles/conv.py): this rank's output channels
    if style is not None and style.spec.style.gathers_output:  # ... of an output gathered whole: gather the term too
        term = style.gather(term)
    return term


def install_halo(conv: nn.Module, path: str, dim: int, rows: int, group, rank: int, cp: int) -> list:
    """Hook `conv` (checked by `resolve_cp`: zero-padded, stride 1, 'same' along `dim`); returns the hook handle."""
    return [conv.register_forward_hook(ConvHalo(path, dim, rows, group, rank, cp))]
