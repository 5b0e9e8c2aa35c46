"""`Split`: the process group a parallel VAE runs on, and the row partition of the call in flight."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from .strips import scaled_bounds


@dataclass
class Split:
    """One VAE's ranks (every rank of the mesh, flattened) and, during a call, the latent rows of each.

    group: the process group over all ranks of the mesh; rank and world are positions in it.
    units: latent rows per rank for the encode/decode in flight (set at the encoder/decoder entry,
        None between calls); every layer derives its own strip bounds from them (`bounds`).
    """

    group: object
    rank: int
    world: int
    units: tuple[int, ...] | None = field(default=None)

    @classmethod
    def over(cls, group) -> Split:
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def bounds(self, local_rows: int) -> tuple[int, ...]:
        """Global row bounds, every rank's, of a tensor whose strip here has `local_rows` rows."""
        assert self.units is not None, "a parallel VAE layer ran outside its encoder/decoder"
        return scaled_bounds(self.units, self.rank, local_rows)

    def counts(self, local_rows: int) -> tuple[int, ...]:
        b = self.bounds(local_rows)
        return tuple(b[q + 1] - b[q] for q in range(self.world))
