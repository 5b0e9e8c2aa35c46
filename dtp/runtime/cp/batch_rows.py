"""A module whose batch rows are independent, run on a share of its rows per rank and all-gathered (a plan's
`cp.batch_rows`, `plan.cp.CpPlan.batch_rows`).

Wan 2.2 Animate encodes the face clip frame by frame: its forward calls `motion_encoder` on
`motion_encode_batch_size` face crops at a time ([b, 3, 512, 512], config default 8), whole on every rank under CP,
so each rank ran the whole encoder and held its largest activations (five [8, 32, 512, 512], 0.134 GB each: the
per-rank peak at cp=8). The encoder treats each crop on its own (convolutions, per-row linears, a QR of a weight),
so rank r runs rows [r c, (r + 1) c) of each call, c = ceil(b / cp), and the c-row outputs are all-gathered in rank
order and trimmed to b: exact, each rank running b / cp crops. A rank whose share is short (b = 5 at cp = 8: c = 1,
ranks 5..7 hold none) runs zero rows in their place, whose outputs the trim drops.

Example: b = 10, cp = 4: c = 3; ranks 0..2 run rows 0-2, 3-5, 6-8, rank 3 runs row 9 and two zero rows; the gathered
[12, D] is cut to [10, D].
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ...errors import ForwardError
from ...styles.collectives import all_gather_along
from .local_embed import Restore


def rows_of(n: int, rank: int, cp: int) -> tuple[int, int, int]:
    """(start, stop, c) of rank's rows of n, c = ceil(n / cp) a rank; stop - start < c for a short share.
    n = 5, cp = 4: c = 2; rank 2 -> (4, 5, 2), rank 3 -> (5, 5, 2)."""
    share = -(-n // cp)
    return min(rank * share, n), min((rank + 1) * share, n), share


def batch_rows_forward(whole, path: str, group, rank: int, cp: int):
    """`whole` (the class's forward) on this rank's rows of input 0, the outputs all-gathered on `group`."""

    def forward(self, x, *args, **kwargs):
        if not isinstance(x, torch.Tensor) or x.ndim == 0:
            raise ForwardError(f"cp.batch_rows '{path}': input 0 must be a batched tensor, got {type(x).__name__}.")
        start, stop, share = rows_of(x.shape[0], rank, cp)
        mine = x[start:stop]
        if stop - start < share:  # a short share: zero rows in place of the missing ones (outputs trimmed below)
            mine = torch.cat([mine, x.new_zeros(share - (stop - start), *x.shape[1:])])
        out = whole(self, mine, *args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.ndim == 0 or out.shape[0] != share:
            raise ForwardError(f"cp.batch_rows '{path}': the output must keep the input's rows (dim 0).")
        return all_gather_along(out, group, 0)[: x.shape[0]]

    return forward


def install_batch_rows(model: nn.Module, paths, group, rank: int, cp: int) -> list:
    """Replace each module's forward with its per-rank share and gather; returns restore handles."""
    handles = []
    for path in paths:
        module = model.get_submodule(path)
        module.forward = types.MethodType(batch_rows_forward(type(module).forward, path, group, rank, cp), module)
        handles.append(Restore(module))
    return handles
