"""Collectives of the parallel VAE: halo rows from the neighbouring strips, and whole tensors from strips.

Point-to-point `isend`/`irecv` in one `batch_isend_irecv` (gloo and NCCL alike); each rank receives
only from its two neighbours. Every rank derives every rank's counts from the same partition
(`strips.conv_rows`), so sends and receives always pair up without a size exchange.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import ForwardError
from .strips import ConvRows


def halo_counts(rows: ConvRows) -> tuple[int, int]:
    """Rows a rank receives from its upper and lower neighbour: the halo minus the image's zero padding."""
    return max(0, rows.top - rows.zeros_top), max(0, rows.bottom - rows.zeros_bottom)


def exchange(x: torch.Tensor, dim: int, needs: list[tuple[int, int]], group, rank: int) -> torch.Tensor:
    """`x` (this rank's strip) with its neighbours' rows attached along `dim`: [above | x | below]."""
    above, below = neighbour_rows(x, dim, needs, group, rank)
    return torch.cat([t for t in (above, x, below) if t is not None], dim=dim)


def neighbour_rows(x: torch.Tensor, dim: int, needs: list[tuple[int, int]], group, rank: int) -> tuple:
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
            f"parallel VAE: a neighbour needs {too_thin} halo rows but rank {rank}'s strip has {own} rows; "
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


def gather_rows(x: torch.Tensor, dim: int, counts: tuple[int, ...], group) -> torch.Tensor:
    """The whole tensor from every rank's strip along `dim` (strips of `counts` rows, in rank order).

    Uneven strips are padded to the longest for the all_gather and trimmed after.
    """
    longest = max(counts)
    padded = x
    if x.shape[dim] < longest:
        padded = torch.cat([x, x.new_zeros(_shape(x, dim, longest - x.shape[dim]))], dim=dim)
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p.narrow(dim, 0, c) for p, c in zip(parts, counts)], dim=dim)


def _shape(x: torch.Tensor, dim: int, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] = rows
    return shape
