"""Collectives of the parallel VAE: halo rows from the neighbouring strips, and whole tensors from strips.

The neighbour exchange itself (`neighbour_rows`, point-to-point `isend`/`irecv` in one `batch_isend_irecv`, each
rank receiving only from its two neighbours) lives in `dtp/neighbours.py`, shared with context parallelism's
token-grid convolutions (`runtime/cp/halo.py`). Every rank derives every rank's counts from the same partition
(`strips.conv_rows`), so sends and receives always pair up without a size exchange.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..neighbours import neighbour_rows  # re-exported: the VAE's callers import it from here
from .strips import ConvRows


def halo_counts(rows: ConvRows) -> tuple[int, int]:
    """Rows a rank receives from its upper and lower neighbour: the halo minus the image's zero padding."""
    return max(0, rows.top - rows.zeros_top), max(0, rows.bottom - rows.zeros_bottom)


def exchange(x: torch.Tensor, dim: int, needs: list[tuple[int, int]], group, rank: int) -> torch.Tensor:
    """`x` (this rank's strip) with its neighbours' rows attached along `dim`: [above | x | below]."""
    above, below = neighbour_rows(x, dim, needs, group, rank)
    return torch.cat([t for t in (above, x, below) if t is not None], dim=dim)


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
