"""Rows moved between ranks: a strip re-cut to an even partition after an upsampling, and any window of rows of a
split tensor.

Strips are dealt in latent rows (`strips.split_rows`), so a latent height that does not divide by the ranks stays
uneven at every level: CogVideoX at 480 x 720 has 60 latent rows, 8 on rank 0 of 8 (7.5 on average), so rank 0 holds
64 of the 480 output rows and its decode peak is 8 / 60 = 0.133 of the whole, not 0.125. The upsampled levels divide
(120, 240, 480 rows: 15, 30, 60 per rank), so the decoder re-cuts its strips at the first of them
(`recut_even`, at the upsampler's conv): 120 rows held as (16, 16, 16, 16, 14, 14, 14, 14) move to 15 each; every x2
upsampling after keeps the partition even. Rows move point-to-point from the rank that holds them (`take_rows`:
each rank knows every rank's rows before and after, so sends and receives pair up without a size exchange); most
moves are between neighbours, but not all (13 latent rows on 8 ranks: the first level that divides is the image's
104 rows, held (16, 16, 16, 16, 16, 8, 8, 8); rank 6's even rows [78, 91) come from ranks 4, 5 and 6).

After a re-cut `Split.bounds` reads the re-cut level and every finer one as even (`Split.even_from`); CogVideoX's
spatial norms read the latent rows below their (re-cut) rows with `take_rows` too (`cogvideox.latent_rows`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .split import Split
from .strips import even_bounds


def recut_even(x: torch.Tensor, dim: int, split: Split) -> torch.Tensor:
    """This rank's rows of the even partition of `x`'s level, when its height divides by the ranks and the strips
    are uneven (rows moved between ranks, `split.even_from` set for the rest of the call); else `x` as is."""
    owned = split.bounds(x.shape[dim])
    height = owned[-1]
    if height % split.world:
        return x
    even = even_bounds(height, split.world)
    if owned == even:
        return x
    assert split.even_from in (None, height), (split.even_from, height)
    split.even_from = height
    return take_rows(x, dim, owned, [(even[q], even[q + 1]) for q in range(split.world)], split)


def take_rows(x: torch.Tensor, dim: int, owned: tuple[int, ...], wanted: list[tuple[int, int]], split: Split):
    """Rows [wanted[rank][0], wanted[rank][1]) of the whole tensor along `dim`, from the ranks that hold them.

    x: this rank's strip, rows [owned[rank], owned[rank + 1]) of the whole; wanted: every rank's window (the same
    list on every rank). One `batch_isend_irecv`: rank q sends rank r the rows of its strip inside r's window.
    """
    rank, lo, hi = split.rank, *wanted[split.rank]
    ops, pieces = [], []
    for q in range(split.world):
        start, stop = max(lo, owned[q]), min(hi, owned[q + 1])  # what this rank takes from q
        if start < stop and q == rank:
            pieces.append(x.narrow(dim, start - owned[rank], stop - start))
        elif start < stop:
            pieces.append(x.new_empty(_shape(x, dim, stop - start)))
            ops.append(dist.P2POp(dist.irecv, pieces[-1], group=split.group, group_peer=q))
        start, stop = max(wanted[q][0], owned[rank]), min(wanted[q][1], owned[rank + 1])  # what q takes from here
        if start < stop and q != rank:
            rows = x.narrow(dim, start - owned[rank], stop - start).contiguous()
            ops.append(dist.P2POp(dist.isend, rows, group=split.group, group_peer=q))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    assert sum(p.shape[dim] for p in pieces) == hi - lo, (owned, wanted, rank)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


def _shape(x: torch.Tensor, dim: int, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] = rows
    return shape
