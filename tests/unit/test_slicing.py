"""Block/rank slicing math: proportions, exact reassembly, and refusal of indivisible blocks."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
from dtp.resolve import resolve
from dtp.resolve.layout import block_sizes, rank_ranges

TP = st.sampled_from([1, 2, 3, 4, 8])


def test_worked_example_from_docstring():
    assert block_sizes(1152, [1, 1, 1, 3, 3]) == (128, 128, 128, 384, 384)
    assert rank_ranges((128, 128, 128, 384, 384), 2, 1) == [(64, 128), (192, 256), (320, 384), (576, 768), (960, 1152)]


def test_absolute_sizes_read_as_unit_proportions():
    assert block_sizes(15360, [3072, 12288]) == (3072, 12288)


@given(blocks=st.lists(st.integers(1, 6), min_size=1, max_size=6), unit=st.integers(1, 64))
def test_proportional_blocks_become_absolute_sizes(blocks, unit):
    total = sum(blocks) * unit
    sizes = block_sizes(total, blocks)
    assert sum(sizes) == total
    assert all(size == b * unit for size, b in zip(sizes, blocks))


@given(blocks=st.lists(st.integers(1, 6), min_size=1, max_size=6), total=st.integers(1, 500))
def test_sum_not_dividing_is_rejected(blocks, total):
    assume(total % sum(blocks))
    with pytest.raises(ValueError, match="do not divide"):
        block_sizes(total, blocks)


def oracle_slice(full: torch.Tensor, dim: int, sizes, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s piece written independently of dtp: per block, `chunk(tp)[rank]`, concatenated."""
    blocks = torch.split(full, list(sizes), dim=dim)
    return torch.cat([block.chunk(tp, dim=dim)[rank] for block in blocks], dim=dim)


@settings(max_examples=60)
@given(
    tp=TP,
    per_rank=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    other=st.integers(1, 5),
    dim=st.sampled_from([0, 1]),
)
def test_rank_slices_match_an_independent_construction_and_reassemble(tp, per_rank, other, dim):
    sizes = tuple(n * tp for n in per_rank)  # every block divides by tp
    shape = [other, other]
    shape[dim] = sum(sizes)
    full = torch.randn(shape)
    layout = dtp.Layout(dim, sizes)
    locals_ = [layout.local_slice(full, tp, rank) for rank in range(tp)]
    for rank, local in enumerate(locals_):
        assert torch.equal(local, oracle_slice(full, dim, sizes, tp, rank)), rank
        assert local.shape == layout.local_shape(full.shape, tp)
    assert torch.equal(layout.assemble(locals_), full)


def test_layout_worked_example():
    """[a0 a1 | b0 b1 b2 b3] at tp=2: rank 0 holds [a0 | b0 b1], rank 1 [a1 | b2 b3]."""
    full = torch.arange(6.0).reshape(6, 1)
    layout = dtp.Layout(0, (2, 4))
    assert layout.local_slice(full, 2, 0).flatten().tolist() == [0.0, 2.0, 3.0]
    assert layout.local_slice(full, 2, 1).flatten().tolist() == [1.0, 4.0, 5.0]


def packed_pair_resolved(blocks):
    plan = dtp.Plan.from_dict(
        {
            "up": {"style": "packed_colwise", "blocks": list(blocks)},
            "down": {"style": "packed_rowwise", "blocks": list(blocks)},
        }
    )
    return resolve(plan, _PackedPair(blocks))


@settings(max_examples=80)
@given(tp=st.integers(1, 8), blocks=st.lists(st.integers(1, 24), min_size=2, max_size=5))
def test_packed_blocks_accepted_exactly_when_tp_divides_every_block(tp, blocks):
    """Both directions against the oracle "every block % tp == 0": accepted and listed, or refused by name."""
    resolved = packed_pair_resolved(blocks)
    valid = all(b % tp == 0 for b in blocks)  # the oracle
    assert (tp in resolved.candidates()) == valid
    if valid:
        resolved.check_tp(tp)
    else:
        index = next(i for i, b in enumerate(blocks) if b % tp)
        with pytest.raises(dtp.PlanError, match=rf"tp={tp} does not divide packed block {index} .*={blocks[index]}"):
            resolved.check_tp(tp)


@settings(max_examples=60)
@given(tp=st.integers(2, 6), k=st.integers(1, 4), data=st.data())
def test_sum_divides_but_one_block_does_not_is_refused(tp, k, data):
    """Built explicitly: the blocks add up to a multiple of tp, yet one block is not a multiple of tp."""
    bad = data.draw(st.integers(1, 6 * tp).filter(lambda b: b % tp), label="bad block")
    fill = tp - bad % tp + tp * data.draw(st.integers(0, 3), label="fill multiple")  # sum back to a multiple of tp
    blocks = [bad, fill] + [tp * k]
    assume(sum(blocks) % tp == 0)
    resolved = packed_pair_resolved(blocks)
    assert tp not in resolved.candidates()
    with pytest.raises(dtp.PlanError, match=rf"tp={tp} does not divide packed block 0 .*={bad}"):
        resolved.check_tp(tp)


def test_sum_divides_but_a_block_does_not():
    """[2, 6] at tp=4: the sum 8 divides, block 0 (size 2) does not."""
    resolved = packed_pair_resolved([2, 6])
    with pytest.raises(dtp.PlanError, match=r"tp=4 does not divide packed block 0 .*=2 \(key .up.\)"):
        resolved.check_tp(4)
    assert resolved.candidates() == [1, 2]


class _PackedPair(nn.Module):
    """x -> up (fused blocks) -> down: the smallest model a packed colwise/rowwise pair fits."""

    def __init__(self, blocks):
        super().__init__()
        self.up = nn.Linear(4, sum(blocks))
        self.down = nn.Linear(sum(blocks), 4)


def oracle_grouped_slice(full, sizes, padded, groups, replicas, tp, rank):
    """Written without dtp's piece arithmetic: build each padded block whole (every segment + its zeros), then
    `chunk(tp / replicas)[rank // replicas]` of it, concatenated over blocks (dim 0)."""
    out = []
    for block, size, padded_size in zip(torch.split(full, list(sizes)), sizes, padded):
        segments = []
        for segment in torch.split(block, size // groups):
            zeros = segment.new_zeros((padded_size - size) // groups, *segment.shape[1:])
            segments += [segment, zeros]
        out.append(torch.cat(segments).chunk(tp // replicas)[rank // replicas])
    return torch.cat(out)


@settings(max_examples=80)
@given(
    parts=st.sampled_from([1, 2, 3, 4]),
    replicas=st.sampled_from([1, 2, 3]),
    groups=st.sampled_from([1, 2, 4]),
    seg=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3)), min_size=1, max_size=3),
)
def test_grouped_shared_slices_match_an_independent_construction(parts, replicas, groups, seg):
    """Padded groups and shared parts (kv heads, resolve/kv_share.py): every rank's piece equals the oracle's, ranks
    r and r + 1 .. r + replicas - 1 hold the same piece, and `assemble` gives back the tensor without padding."""
    tp = parts * replicas
    # per block: `real` rows per segment, padded per segment so that the padded block divides into `parts`
    sizes, padded = [], []
    for real, extra in seg:
        padded_seg = real + extra
        while (padded_seg * groups) % parts:
            padded_seg += 1
        sizes.append(real * groups)
        padded.append(padded_seg * groups)
    full = torch.randn(sum(sizes), 3)
    layout = dtp.Layout(0, tuple(sizes), tuple(padded), groups, replicas)
    locals_ = [layout.local_slice(full, tp, rank) for rank in range(tp)]
    for rank, local in enumerate(locals_):
        assert torch.equal(local, oracle_grouped_slice(full, sizes, padded, groups, replicas, tp, rank))
        assert local.shape == layout.local_shape(full.shape, tp)
        assert torch.equal(local, locals_[rank - rank % replicas])
    assert torch.equal(layout.assemble(locals_), full)
