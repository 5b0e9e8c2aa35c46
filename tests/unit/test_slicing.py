"""Block/rank slicing math: proportions, exact reassembly, and refusal of indivisible blocks."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
from dtp.resolve import resolve
from dtp.resolve.layout import assemble, block_sizes, indivisible_blocks, local_slice, rank_ranges

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
    if total % sum(blocks):
        with pytest.raises(ValueError, match="do not divide"):
            block_sizes(total, blocks)


@settings(max_examples=60)
@given(
    tp=TP,
    per_rank=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    other=st.integers(1, 5),
    dim=st.sampled_from([0, 1]),
)
def test_gathered_rank_slices_reassemble_exactly(tp, per_rank, other, dim):
    sizes = [n * tp for n in per_rank]  # every block divides by tp
    shape = [other, other]
    shape[dim] = sum(sizes)
    full = torch.randn(shape)
    locals_ = [local_slice(full, dim, sizes, tp, rank) for rank in range(tp)]
    assert all(local.shape[dim] == sum(sizes) // tp for local in locals_)
    assert torch.equal(assemble(locals_, dim, sizes), full)


@settings(max_examples=60)
@given(tp=st.sampled_from([2, 3, 4]), blocks=st.lists(st.integers(1, 24), min_size=2, max_size=5))
def test_any_indivisible_block_is_rejected_by_name(tp, blocks):
    bad = indivisible_blocks(blocks, tp)
    if not bad:
        return
    model = _PackedPair(blocks)
    plan = dtp.Plan.from_dict(
        {
            "up": {"style": "packed_colwise", "blocks": list(blocks)},
            "down": {"style": "packed_rowwise", "blocks": list(blocks)},
        }
    )
    resolved = resolve(plan, model)
    index, size = bad[0]
    with pytest.raises(dtp.PlanError, match=rf"packed block {index} .*={size}"):
        resolved.check_tp(tp)
    assert tp not in resolved.candidates()


def test_sum_divides_but_a_block_does_not():
    """[2, 6] at tp=4: the sum 8 divides, block 0 (size 2) does not."""
    plan = dtp.Plan.from_dict(
        {
            "up": {"style": "packed_colwise", "blocks": [2, 6]},
            "down": {"style": "packed_rowwise", "blocks": [2, 6]},
        }
    )
    resolved = resolve(plan, _PackedPair([2, 6]))
    with pytest.raises(dtp.PlanError, match=r"tp=4 does not divide packed block 0 .*=2 \(key .up.\)"):
        resolved.check_tp(4)
    assert resolved.candidates() == [1, 2]


class _PackedPair(nn.Module):
    """x -> up (fused blocks) -> down: the smallest model a packed colwise/rowwise pair fits."""

    def __init__(self, blocks):
        super().__init__()
        self.up = nn.Linear(4, sum(blocks))
        self.down = nn.Linear(sum(blocks), 4)
