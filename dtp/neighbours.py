"""Halo rows from the neighbouring ranks: the one neighbour exchange of dtp.

A convolution over rows split across ranks (the parallel VAE's strips, context parallelism's token grid under
Sana's Mix-FFN) needs a few rows of each neighbour. Point-to-point `isend`/`irecv` in one `batch_isend_irecv`
(gloo and NCCL alike); each rank receives only from its two neighbours, and every rank derives every rank's
counts from the same partition, so sends and receives pair up without a size exchange. Below both `vae` and
`runtime` in the layer map, so both import it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import ForwardError


def neighbour_rows(
    x: torch.Tensor, dim: int, needs: list[tuple[int, int]], group, rank: int, what: str = "parallel VAE"
) -> tuple:
    """(rows from the rank above, rows from the rank below) along `dim`, None where none are needed.

    needs[q] = (rows rank q takes from rank q - 1, rows it takes from rank q + 1), for every rank q.
    Rank r sends its last needs[r + 1][0] rows down and its first needs[r - 1][1] rows up.
    """
    world = len(needs)
    own = x.shape[dim]
    from_above, from_below = needs[rank]
    to_below = needs[rank + 1][0] if rank + 1 < world else 0
    to_above = needs[rank - 1][1] if rank > 0 else 0
    too_thin = max(to_below, to_above)
    if too_thin > own:
        raise ForwardError(
            f"{what}: a neighbour needs {too_thin} halo rows but rank {rank}'s strip has {own} rows; "
            f"use fewer ranks or a larger image."
        )
    ops, above, below = [], None, None
    if from_above:
        above = x.new_empty(_shape(x, dim, from_above))
        ops.append(dist.P2POp(dist.irecv, above, group=group, group_peer=rank - 1))
    if from_below:
        below = x.new_empty(_shape(x, dim, from_below))
        ops.append(dist.P2POp(dist.irecv, below, group=group, group_peer=rank + 1))
    if to_below:
        last = x.narrow(dim, own - to_below, to_below).contiguous()
        ops.append(dist.P2POp(dist.isend, last, group=group, group_peer=rank + 1))
    if to_above:
        first = x.narrow(dim, 0, to_above).contiguous()
        ops.append(dist.P2POp(dist.isend, first, group=group, group_peer=rank - 1))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return above, below


def _shape(x: torch.Tensor, dim: int, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] = rows
    return shape
