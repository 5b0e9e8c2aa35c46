"""`Split`: the process group a parallel VAE runs on, and the row partition of the call in flight."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch.distributed as dist

from .strips import even_bounds, on_even_level, scaled_bounds


@dataclass
class Split:
    """One VAE's ranks (every rank of the mesh, flattened) and, during a call, the latent rows of each.

    group: the process group over all ranks of the mesh; rank and world are positions in it.
    units: latent rows per rank for the encode/decode in flight (set at the encoder/decoder entry,
        None between calls); every layer derives its own strip bounds from them (`bounds`).
    even_from: the height of the first level the call in flight re-cut evenly (`recut.recut_even`: CogVideoX's
        decoder, after an upsampling whose height divides by the ranks), None before; that level and every one
        2^k x finer are dealt height / world rows per rank.
    """

    group: object
    rank: int
    world: int
    units: tuple[int, ...] | None = field(default=None)
    even_from: int | None = field(default=None)

    @classmethod
    def over(cls, group) -> Split:
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    @contextmanager
    def call(self, units: tuple[int, ...]):
        """The partition of one encode / decode: `units` latent rows per rank, no level re-cut yet; reset after."""
        self.units, self.even_from = units, None
        try:
            yield
        finally:
            self.units, self.even_from = None, None

    def bounds(self, local_rows: int) -> tuple[int, ...]:
        """Global row bounds, every rank's, of a tensor whose strip here has `local_rows` rows.

        A strip of a re-cut level is told from one of the latent partition by its row count alone: a level
        `even_from x 2^k` rows high has `H x 2^e / world` rows on every rank (H the latent height), never
        `units[rank] x 2^j` when H does not divide by world: that needs (H / world) / units[rank] = 2^(j - e), but
        units[rank] is floor or ceil of H / world >= 1, so the ratio lies in (1/2, 1) or (1, 2). When H divides, the
        two partitions are the same and nothing is re-cut.
        """
        assert self.units is not None, "a parallel VAE layer ran outside its encoder/decoder"
        height = local_rows * self.world
        if self.even_from is not None and on_even_level(height, self.even_from):
            return even_bounds(height, self.world)
        return scaled_bounds(self.units, self.rank, local_rows)

    def counts(self, local_rows: int) -> tuple[int, ...]:
        b = self.bounds(local_rows)
        return tuple(b[q + 1] - b[q] for q in range(self.world))
