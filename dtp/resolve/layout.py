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

Shared kv heads (GQA with fewer kv heads than ranks, as vLLM does): `replicas = R` ranks hold the
same piece. The block is split into `tp / R` parts and rank `r` holds part `r // R`. Example: 4 kv
heads of width 128 (B = 512) at tp = 8, R = 2: ranks 0 and 1 hold rows 0:128, ranks 6 and 7 rows 384:512.

Groups (the query heads of those kv heads): `groups = G` cuts each block into G equal segments,
each padded on its own (real rows, then zeros), and the padded segments are concatenated before the
split. So every rank's rows come from one segment when G divides the parts. Example: Qwen2.5-VL-7B,
28 query heads in 4 groups of 7 (one per kv head) at tp = 8: each group pads to 8 heads (P = 32
heads), and rank 3 holds heads 11:14 of group 1 plus one zero head, next to kv head 1.

A `Layout(dim, block_sizes, padded_sizes, groups, replicas)` names such a split for one tensor;
`None` where a layout is expected means "every rank holds the tensor whole".
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
    sizes: Sequence[int],
    tp: int,
    rank: int,
    padded: Sequence[int] | None = None,
    groups: int = 1,
    replicas: int = 1,
) -> list[tuple[int, int, int]]:
    """(start, stop, zeros) pieces: rank `rank` holds real rows [start, stop) then `zeros` zero rows, in order.

    `padded` (default: `sizes`, no padding) gives each block's padded size; each block is `groups`
    segments padded on their own; `tp / replicas` distinct parts (see the module docstring).
    Worked examples: `rank_pieces((120,), 4, 3, padded=(128,)) == [(96, 120, 8)]`;
    `rank_pieces((28,), 8, 3, padded=(32,), groups=4) == [(11, 14, 1)]` (rows of heads 11-13, one zero head);
    `rank_pieces((4,), 8, 3, replicas=2) == [(1, 2, 0)]` (kv head 1, which rank 2 holds too).
    """
    padded = tuple(sizes) if padded is None else tuple(padded)
    check_split(sizes, padded, tp, groups, replicas)
    parts, part = tp // replicas, rank // replicas
    pieces, offset = [], 0
    for size, padded_size in zip(sizes, padded):
        real, seg = size // groups, padded_size // groups  # one segment: `real` rows, then `seg - real` zeros
        chunk = padded_size // parts
        lo, hi = part * chunk, (part + 1) * chunk  # this part, in padded coordinates of the block
        for s in range(lo // seg, -(-hi // seg)):
            u, v = max(lo, s * seg) - s * seg, min(hi, (s + 1) * seg) - s * seg  # overlap, segment coordinates
            start, stop = offset + s * real + min(u, real), offset + s * real + min(v, real)
            pieces.append((start, stop, (v - u) - (stop - start)))
        offset += size
    return pieces


def check_split(sizes: Sequence[int], padded: Sequence[int], tp: int, groups: int = 1, replicas: int = 1) -> None:
    """The split is well formed: padded >= real, groups divide both, the parts divide every padded block."""
    assert len(padded) == len(sizes) and all(p >= s for p, s in zip(padded, sizes)), (sizes, padded)
    assert tp % replicas == 0, (tp, replicas)
    assert all(s % groups == 0 and p % groups == 0 for s, p in zip(sizes, padded)), (sizes, padded, groups)
    assert not indivisible_blocks(padded, tp // replicas), (padded, tp, replicas)


def local_slice(
    tensor,
    dim: int,
    sizes: Sequence[int],
    tp: int,
    rank: int,
    padded: Sequence[int] | None = None,
    groups: int = 1,
    replicas: int = 1,
) -> torch.Tensor:
    """Rank `rank`'s slice of `tensor` along `dim`, as a new contiguous tensor (zero rows where padded).

    `tensor` is a `torch.Tensor` or a safetensors slice (`get_slice`), so the same code reads a
    weight in memory and one rank's rows off disk; only the selected rows are ever materialized.
    """
    shape = list(tensor.shape) if isinstance(tensor, torch.Tensor) else list(tensor.get_shape())
    pieces = []
    for start, stop, zeros in rank_pieces(sizes, tp, rank, padded, groups, replicas):
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
    locals_: Sequence[torch.Tensor],
    dim: int,
    sizes: Sequence[int],
    padded: Sequence[int] | None = None,
    groups: int = 1,
    replicas: int = 1,
) -> torch.Tensor:
    """Inverse of `local_slice`: the full tensor from every rank's local slice, in rank order (padding dropped)."""
    distinct = list(locals_)[::replicas]  # ranks r, r + 1, ..., r + replicas - 1 hold the same part
    parts = len(distinct)
    padded = tuple(sizes) if padded is None else tuple(padded)
    per_part = [size // parts for size in padded]
    split = [torch.split(local, per_part, dim=dim) for local in distinct]
    out = []
    for block, (size, padded_size) in enumerate(zip(sizes, padded)):
        whole = torch.cat([split[part][block] for part in range(parts)], dim=dim)
        segments = torch.split(whole, padded_size // groups, dim=dim)
        out += [segment.narrow(dim, 0, size // groups) for segment in segments]
    return torch.cat(out, dim=dim)


@dataclass(frozen=True)
class Layout:
    """How one tensor is split over the `tp` ranks: along `dim`, each of `block_sizes` on its own.

    `block_sizes` add up to the tensor's size along `dim`; one block for plain colwise/rowwise.
    Example: a fused QKV weight `[3 * 64, 32]` is `Layout(dim=0, block_sizes=(64, 64, 64))`.
    `padded_sizes` (None: no padding) are the block sizes after zero-padding, each `>=` its block
    and divisible by tp: `Layout(0, (120,), (128,))` holds 30 heads of width 4 as 32 (tp = 4).
    `groups` segments per block are padded on their own; `replicas` ranks hold each part (shared kv heads):
    `Layout(0, (512,), replicas=2)` at tp = 8 is 4 kv heads of 128, each on two ranks.
    """

    dim: int
    block_sizes: tuple[int, ...]
    padded_sizes: tuple[int, ...] | None = None
    groups: int = 1
    replicas: int = 1

    @property
    def split_sizes(self) -> tuple[int, ...]:
        """The block sizes the ranks split: the padded ones when padded."""
        return self.block_sizes if self.padded_sizes is None else self.padded_sizes

    @property
    def is_padded(self) -> bool:
        return self.split_sizes != self.block_sizes

    def parts(self, tp: int) -> int:
        """How many different pieces the `tp` ranks hold (tp, or tp / replicas for shared kv heads)."""
        return tp // self.replicas

    def local_slice(self, tensor, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s piece of `tensor` (a tensor or a safetensors slice), a new contiguous tensor."""
        return local_slice(tensor, self.dim, self.block_sizes, tp, rank, self.padded_sizes, self.groups, self.replicas)

    def assemble(self, locals_: Sequence[torch.Tensor]) -> torch.Tensor:
        """The full (unpadded) tensor from every rank's piece, in rank order."""
        return assemble(locals_, self.dim, self.block_sizes, self.padded_sizes, self.groups, self.replicas)

    def local_shape(self, shape: Sequence[int], tp: int) -> tuple[int, ...]:
        """The shape of one rank's piece of a tensor of `shape` (padding included)."""
        local = list(shape)
        local[self.dim] = sum(self.split_sizes) // self.parts(tp)
        return tuple(local)
