"""`Layout` and the block/rank slicing math: the one home for both (styles, loader, checks and tests).

A sharded dim of size `D` is partitioned into blocks `B_1 + ... + B_k = D` (one block for plain
colwise/rowwise; several for a fused Linear). Each block is split across the `tp` ranks on its
own, so rank `r` holds, for every block `i`, the rows

    [off_i + r * B_i / tp, off_i + (r + 1) * B_i / tp),   off_i = B_1 + ... + B_{i-1}

and its local tensor is those pieces concatenated in block order. Example: D = 1152 with
proportional blocks [1, 1, 1, 3, 3] gives sizes [128, 128, 128, 384, 384]; at tp = 2, rank 1
holds rows 64:128, 192:256, 320:384, 576:768 and 960:1152.

A `Layout(dim, block_sizes)` names such a split for one tensor; `None` where a layout is expected
means "every rank holds the tensor whole".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def block_sizes(total: int, blocks: Sequence[int]) -> tuple[int, ...]:
    """Absolute block sizes for `blocks` given as proportions or as absolute sizes.

    Absolute sizes are proportions whose unit is 1, so both read the same way:
    `block_sizes(1152, [1, 1, 1, 3, 3]) == (128, 128, 128, 384, 384)` and
    `block_sizes(15360, [3072, 12288]) == (3072, 12288)`.
    Raises ValueError when the sum of `blocks` does not divide `total`.
    """
    unit_count = sum(blocks)
    if unit_count <= 0 or total % unit_count:
        raise ValueError(f"blocks {list(blocks)} (sum {unit_count}) do not divide a dim of size {total}")
    unit = total // unit_count
    return tuple(b * unit for b in blocks)


def indivisible_blocks(sizes: Sequence[int], tp: int) -> list[tuple[int, int]]:
    """(index, size) of every block that `tp` does not divide; empty when the layout is valid."""
    return [(i, size) for i, size in enumerate(sizes) if size % tp]


def rank_ranges(sizes: Sequence[int], tp: int, rank: int) -> list[tuple[int, int]]:
    """[start, stop) of every piece rank `rank` holds, in block order (see module docstring)."""
    assert not indivisible_blocks(sizes, tp), (sizes, tp)
    ranges, offset = [], 0
    for size in sizes:
        chunk = size // tp
        ranges.append((offset + rank * chunk, offset + (rank + 1) * chunk))
        offset += size
    return ranges


def local_slice(tensor, dim: int, sizes: Sequence[int], tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s slice of `tensor` along `dim`, as a new contiguous tensor.

    `tensor` is a `torch.Tensor` or a safetensors slice (`get_slice`), so the same code reads a
    weight in memory and one rank's rows off disk; only the selected rows are ever materialized.
    """
    ndim = tensor.dim() if isinstance(tensor, torch.Tensor) else len(tensor.get_shape())
    pieces = []
    for start, stop in rank_ranges(sizes, tp, rank):
        index = [slice(None)] * ndim
        index[dim] = slice(start, stop)
        pieces.append(tensor[tuple(index)])
    if len(pieces) > 1:
        return torch.cat(pieces, dim=dim)
    # A view of the full tensor (or of a memory-mapped file) would keep all of it alive: copy.
    return pieces[0].clone(memory_format=torch.contiguous_format)


def assemble(locals_: Sequence[torch.Tensor], dim: int, sizes: Sequence[int]) -> torch.Tensor:
    """Inverse of `local_slice`: the full tensor from every rank's local slice, in rank order."""
    tp = len(locals_)
    per_rank = [size // tp for size in sizes]
    split = [torch.split(local, per_rank, dim=dim) for local in locals_]
    pieces = [split[rank][block] for block in range(len(sizes)) for rank in range(tp)]
    return torch.cat(pieces, dim=dim)


@dataclass(frozen=True)
class Layout:
    """How one tensor is split over the `tp` ranks: along `dim`, each of `block_sizes` on its own.

    `block_sizes` add up to the tensor's size along `dim`; one block for plain colwise/rowwise.
    Example: a fused QKV weight `[3 * 64, 32]` is `Layout(dim=0, block_sizes=(64, 64, 64))`.
    """

    dim: int
    block_sizes: tuple[int, ...]

    def local_slice(self, tensor, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s piece of `tensor` (a tensor or a safetensors slice), a new contiguous tensor."""
        return local_slice(tensor, self.dim, self.block_sizes, tp, rank)

    def assemble(self, locals_: Sequence[torch.Tensor]) -> torch.Tensor:
        """The full tensor from every rank's piece, in rank order."""
        return assemble(locals_, self.dim, self.block_sizes)

    def local_shape(self, shape: Sequence[int], tp: int) -> tuple[int, ...]:
        """The shape of one rank's piece of a tensor of `shape`."""
        local = list(shape)
        local[self.dim] = sum(self.block_sizes) // tp
        return tuple(local)
