"""Convolutions over the split token grid: halo rows from the neighbouring cp ranks (a plan's `cp.halo`).

Sana's Mix-FFN unflattens each rank's tokens to its [B, C, H / cp, W] rows of the latent grid and runs a 3 x 3
depthwise conv (padding p = 1) on them: each output row needs the p input rows above and below it, and at a rank's
first and last p rows those sit on the neighbouring ranks. The conv runs on the rank's own rows as usual (its zero
padding is right at the image's top on rank 0 and bottom on the last rank, where one process pads too, and wrong at
the seams); a forward hook then brings p rows from each neighbour (`dtp/neighbours.py`, the exchange the parallel
VAE uses) and recomputes only the 2 p seam rows from 3 p-row windows, [above | own rows 0..2p) and
[own rows h-2p..h | below], convolved without padding along the rows, so each gives exactly its p middle output
rows, each from the input rows it needs: exact. Recomputing the seams
instead of convolving [above | own | below] keeps the per-rank peak at the one-process one / cp (Sana 1.6B at
1024² and cp = 8 has 4 rows a rank: a whole-strip halo added 50 % to the Mix-FFN's largest tensors, 1.76x the ideal
peak). A strip thinner than 2 p rows is convolved whole with its halo. Example: H = 8, cp = 4, p = 1: rank 1 holds
rows 2-3, its output row 2 is recomputed from rows 1-3 and row 3 from rows 2-4.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...neighbours import neighbour_rows


class ConvHalo:
    """Forward hook of one 'same' conv (p = `rows` of padding along `dim`) whose input rows are split over `cp`."""

    def __init__(self, path: str, dim: int, rows: int, group, rank: int, cp: int):
        self.path, self.dim, self.rows, self.group, self.rank = path, dim, rows, group, rank
        # rows each rank q takes from above and below: none beyond the image's edges
        self.needs = [(0 if q == 0 else rows, 0 if q == cp - 1 else rows) for q in range(cp)]

    def __call__(self, module, args, output):
        x, dim, p = args[0], self.dim, self.rows
        above, below = neighbour_rows(x, dim, self.needs, self.group, self.rank, what=f"cp halo of '{self.path}'")
        own = x.shape[dim]
        if own < 2 * p:  # thinner than two halos: convolve [above | own | below], zero rows beyond the image
            edge = list(x.shape)
            edge[dim] = p
            above, below = (x.new_zeros(edge) if t is None else t for t in (above, below))
            return _unpadded(module, torch.cat([above, x, below], dim=dim), dim)
        if above is not None:
            output.narrow(dim, 0, p).copy_(_unpadded(module, torch.cat([above, x.narrow(dim, 0, 2 * p)], dim=dim), dim))
        if below is not None:
            window = torch.cat([x.narrow(dim, own - 2 * p, 2 * p), below], dim=dim)
            output.narrow(dim, own - p, p).copy_(_unpadded(module, window, dim))
        return output


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _unpadded(conv: nn.Module, window: torch.Tensor, dim: int) -> torch.Tensor:
    """`conv` on `window` without its padding along `dim`: the 3p input rows give exactly the p middle output rows,
    each from its own rows (no output row of the halo is computed to be dropped)."""
    padding = list(conv.padding)
    padding[dim - 2] = 0
    return _CONV[len(padding)](window, conv.weight, conv.bias, conv.stride, tuple(padding), conv.dilation, conv.groups)


def install_halo(conv: nn.Module, path: str, dim: int, rows: int, group, rank: int, cp: int) -> list:
    """Hook `conv` (checked by `resolve_cp`: zero-padded, stride 1, 'same' along `dim`); returns the hook handle."""
    return [conv.register_forward_hook(ConvHalo(path, dim, rows, group, rank, cp))]
