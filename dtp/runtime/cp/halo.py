"""Convolutions over the split token grid: halo rows from the neighbouring cp ranks (a plan's `cp.halo`).

Sana's Mix-FFN unflattens each rank's tokens to its [B, C, H / cp, W] rows of the latent grid and runs a 3 x 3
depthwise conv (padding 1) on them: each output row needs the input row above and below it, and at a rank's first
and last row those sit on the neighbouring ranks. The pre-hook brings `rows` rows from each neighbour
(`dtp/neighbours.py`, the exchange the parallel VAE uses) and runs the conv on [above | own | below]; the hook
drops the output rows of the halo. The conv's own zero padding then pads only the image's top (rank 0) and
bottom (the last rank), where one process pads too, and the halo rows' outputs, padded wrongly at the seams,
are the ones dropped: exact. Example: H = 8, cp = 4, rank 1 holds rows 2-3, convolves rows 1-4, keeps outputs 2-3.
"""

from __future__ import annotations

import torch
from torch import nn

from ...neighbours import neighbour_rows


class ConvHalo:
    """Forward pre-hook and hook of one 'same' conv whose input rows (dim `dim`) are split over `cp` ranks."""

    def __init__(self, path: str, dim: int, rows: int, group, rank: int, cp: int):
        self.path, self.dim, self.group, self.rank = path, dim, group, rank
        # rows each rank q takes from above and below: none beyond the image's edges
        self.needs = [(0 if q == 0 else rows, 0 if q == cp - 1 else rows) for q in range(cp)]
        self.added = (0, 0)  # halo rows attached to the running call's input: (above, below)

    def before(self, module, args):
        x, dim = args[0], self.dim
        above, below = neighbour_rows(x, dim, self.needs, self.group, self.rank, what=f"cp halo of '{self.path}'")
        self.added = tuple(0 if t is None else t.shape[dim] for t in (above, below))
        return (torch.cat([t for t in (above, x, below) if t is not None], dim=dim), *args[1:])

    def after(self, module, args, output):
        top, bottom = self.added
        return output.narrow(self.dim, top, output.shape[self.dim] - top - bottom)


def install_halo(conv: nn.Module, path: str, dim: int, rows: int, group, rank: int, cp: int) -> list:
    """Hook `conv` (checked by `resolve_cp`: zero-padded, stride 1, 'same' along `dim`); returns hook handles."""
    halo = ConvHalo(path, dim, rows, group, rank, cp)
    return [conv.register_forward_pre_hook(halo.before), conv.register_forward_hook(halo.after)]
