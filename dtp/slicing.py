"""Block/rank slicing math: the one home for it (styles, loader and tests all call these).

A sharded dim of size `D` is partitioned into blocks `B_1 + ... + B_k = D` (one block for plain
colwise/rowwise; several for a fused Linear). Each block is split across the `tp` ranks on its
own, so rank `r` holds, for every block `i`, the rows

    [off_i + r * B_i / tp, off_i + (r + 1) * B_i / tp),   off_i = B_1 + ... + B_{i-1}

and its local tensor is those pieces concatenated in block order. Example: D = 1152 with
proportional blocks [1, 1, 1, 3, 3] gives sizes [128, 128, 128, 384, 384]; at tp = 2, rank 1
holds rows 64:128, 192:256, 320:384, 576:768 and 960:1152.
"""

from __future__ import annotations

from typing import Sequence

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
