"""`Layout` and the block/rank slicing math: the one home for both (styles, loader, checks and tests).

A sharded dim of size `D` is partitioned into blocks `B_1 + ... + B_k = D` (one block for plain
colwise/rowwise; several for a fused Linear). Each block is split across the `tp` ranks on its
own, so rank `r` holds, for every block `i`, the rows

    [off_i + r * B_i / tp, off_i + (r + 1) * B_i / tp),   off_i = B_1 + ... + B_{i-1}

and its local tensor is those pieces concatenated in block order. Example: D = 1152 with
proportional blocks [1, 1, 1, 3, 3] gives sizes [128, 128, 128, 384, 384]; at tp = 2, rank 1
holds rows 64:128, 192:256, 320:384, 576:768 and 960:1152.

Padding (`pad=True`, see `padding.py`): a block `B_i` that `tp` does not divide is split as if
it had `P_i >= B_i` rows, the last `P_i - B_i` of them zero. Rank `r` holds the padded rows
`[r * P_i / tp, (r + 1) * P_i / tp)` of each block: the real ones read from the tensor, the rest
made as zeros, so no full (padded) tensor is ever built. Example: 30 heads of width 4 (B = 120)
at tp = 4 pad to 32 heads (P = 128): ranks 0-2 hold rows 0:32, 32:64, 64:96; rank 3 holds rows
96:120 and 8 zero rows (two zero heads).

A `Layout(dim, block_sizes, padded_sizes)` names such a split for one tensor; `None` where a layout
is expected means "every rank holds the tensor whole".
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
    return [(start, stop) for start, stop, _ in rank_pieces(sizes, tp, rank)]


def rank_pieces(
    sizes: Sequence[int], tp: int, rank: int, padded: Sequence[int] | None = None
) -> list[tuple[int, int, int]]:
    """(start, stop, zeros) per block: rank `rank` holds real rows [start, stop) then `zeros` zero rows.

    `padded` (default: `sizes`, no padding) gives each block's padded size, which `tp` divides.
    Worked example: `rank_pieces((120,), 4, 3, padded=(128,)) == [(96, 120, 8)]`.
    """
    padded = tuple(sizes) if padded is None else tuple(padded)
    assert len(padded) == len(sizes) and all(p >= s for p, s in zip(padded, sizes)), (sizes, padded)
    assert not indivisible_blocks(padded, tp), (padded, tp)
    pieces, offset = [], 0
    for size, padded_size in zip(sizes, padded):
        chunk = padded_size // tp
        start, stop = min(rank * chunk, size), min((rank + 1) * chunk, size)
        pieces.append((offset + start, offset + stop, chunk - (stop - start)))
        offset += size
    return pieces


def local_slice(
    tensor, dim: int, sizes: Sequence[int], tp: int, rank: int, padded: Sequence[int] | None = None
) -> torch.Tensor:
    """Rank `rank`'s slice of `tensor` along `dim`, as a new contiguous tensor (zero rows where padded).

    `tensor` is a `torch.Tensor` or a safetensors slice (`get_slice`), so the same code reads a
    weight in memory and one rank's rows off disk; only the selected rows are ever materialized.
    """
    shape = list(tensor.shape) if isinstance(tensor, torch.Tensor) else list(tensor.get_shape())
    pieces = []
    for start, stop, zeros in rank_pieces(sizes, tp, rank, padded):
        index = [slice(None)] * len(shape)
        index[dim] = slice(start, stop)
        real = tensor[tuple(index)]  # an empty slice when this rank holds only padding of the block
        pieces.append(real)
        if zeros:
            pieces.append(real.new_zeros(shape[:dim] + [zeros] + shape[dim + 1 :]))
    pieces = [p for p in pieces if p.shape[dim]] or pieces[:1]
    if len(pieces) > 1:
        return torch.cat(pieces, dim=dim)
    # A view of the full tensor (or of a memory-mapped file) would keep all of it alive: copy.
    return pieces[0].clone(memory_format=torch.contiguous_format)


def assemble(
    locals_: Sequence[torch.Tensor], dim: int, sizes: Sequence[int], padded: Sequence[int] | None = None
) -> torch.Tensor:
    """Inverse of `local_slice`: the full tensor from every rank's local slice, in rank order (padding dropped)."""
    tp = len(locals_)
    padded = tuple(sizes) if padded is None else tuple(padded)
    per_rank = [size // tp for size in padded]
    split = [torch.split(local, per_rank, dim=dim) for local in locals_]
    blocks = [torch.cat([split[rank][block] for rank in range(tp)], dim=dim) for block in range(len(sizes))]
    return torch.cat([b.narrow(dim, 0, size) for b, size in zip(blocks, sizes)], dim=dim)


@dataclass(frozen=True)
class Layout:
    """How one tensor is split over the `tp` ranks: along `dim`, each of `block_sizes` on its own.

    `block_sizes` add up to the tensor's size along `dim`; one block for plain colwise/rowwise.
    Example: a fused QKV weight `[3 * 64, 32]` is `Layout(dim=0, block_sizes=(64, 64, 64))`.
    `padded_sizes` (None: no padding) are the block sizes after zero-padding, each `>=` its block
    and divisible by tp: `Layout(0, (120,), (128,))` holds 30 heads of width 4 as 32 (tp = 4).
    """

    dim: int
    block_sizes: tuple[int, ...]
    padded_sizes: tuple[int, ...] | None = None

    @property
    def split_sizes(self) -> tuple[int, ...]:
        """The block sizes the ranks split: the padded ones when padded."""
        return self.block_sizes if self.padded_sizes is None else self.padded_sizes

    @property
    def is_padded(self) -> bool:
        return self.split_sizes != self.block_sizes

    def local_slice(self, tensor, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s piece of `tensor` (a tensor or a safetensors slice), a new contiguous tensor."""
        return local_slice(tensor, self.dim, self.block_sizes, tp, rank, self.padded_sizes)

    def assemble(self, locals_: Sequence[torch.Tensor]) -> torch.Tensor:
        """The full (unpadded) tensor from every rank's piece, in rank order."""
        return assemble(locals_, self.dim, self.block_sizes, self.padded_sizes)

    def local_shape(self, shape: Sequence[int], tp: int) -> tuple[int, ...]:
        """The shape of one rank's piece of a tensor of `shape` (padding included)."""
        local = list(shape)
        local[self.dim] = sum(self.split_sizes) // tp
        return tuple(local)
