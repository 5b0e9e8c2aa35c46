"""CP for Sana, the pure parts: the Mix-FFN conv's halo rows (the seam rows = the whole conv's rows, by an
independent construction), row counts divided by cp, the checks of `cp.halo` and linear attention at resolve.
Parity on processes: tests/distributed/test_cp_coverage.py (Sana at (2, 2) and (4, 1), both modes, two controls)."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
import dtp.runtime.cp.halo as halo_module
from dtp import ForwardError
from dtp.plan.cp import HaloRule, SplitRule
from dtp.resolve import resolve, resolve_cp
from dtp.runtime.cp.hooks import SplitInputs
from dtp.testing.tiny import tiny_model

SANA = "SanaTransformer2DModel"


def _rows_of(whole: torch.Tensor, dim: int, cp: int):
    """A stand-in for the neighbour exchange in one process: rank r's halo rows read from the whole tensor."""

    def neighbour_rows(x, d, needs, group, rank, what=""):
        size = whole.shape[dim] // cp
        up, down = needs[rank]
        above = whole.narrow(dim, rank * size - up, up) if up else None
        below = whole.narrow(dim, (rank + 1) * size, down) if down else None
        return above, below

    return neighbour_rows


@settings(max_examples=40, deadline=None)
@given(rows_per_rank=st.integers(1, 3), cp=st.integers(1, 4), kernel=st.sampled_from([1, 3, 5]), seed=st.integers(0, 9))
def test_halo_conv_rows_equal_the_whole_convs_rows(rows_per_rank, cp, kernel, seed):
    """Depthwise 'same' conv over an H x 5 grid, H = cp x rows: each rank's hooked conv on its rows (seam rows
    recomputed with the halo; strips thinner than 2 halos convolved whole) equals rows [r H / cp, (r + 1) H / cp)
    of the conv on the whole grid."""
    pad = kernel // 2
    assume(rows_per_rank >= pad)  # a strip thinner than its neighbours' halo is a ForwardError (neighbour_rows)
    torch.manual_seed(seed)
    conv = nn.Conv2d(6, 6, kernel, 1, pad, groups=6)
    whole = torch.randn(2, 6, rows_per_rank * cp, 5)
    expected = conv(whole).chunk(cp, dim=2)
    with mock.patch.object(halo_module, "neighbour_rows", _rows_of(whole, 2, cp)):
        _each_rank(conv, whole, pad, cp, expected)


def _each_rank(conv, whole, pad: int, cp: int, expected) -> None:
    for rank in range(cp):
        handles = halo_module.install_halo(conv, "ff.conv_depth", 2, pad, None, rank, cp)
        try:
            got = conv(whole.chunk(cp, dim=2)[rank])
        finally:
            for handle in handles:
                handle.remove()
        torch.testing.assert_close(got, expected[rank], rtol=0, atol=1e-6)


def test_row_count_is_divided_by_cp_or_refused_naming_it():
    """`{count: true}`: Sana's block gets height / cp; a height cp does not divide is a ForwardError naming both."""
    block = tiny_model(SANA).transformer_blocks[0]
    rule = SplitRule("transformer_blocks.*", "height", 0, count=True)
    hook = SplitInputs("transformer_blocks.0", block, [rule], rank=1, cp=4)
    args, _ = hook(block, (torch.zeros(1), None, None, None, None, 8, 8), {})
    assert args[5:] == (2, 8)
    with pytest.raises(ForwardError, match="outer size height=6 does not divide by the cp degree 4"):
        hook(block, (torch.zeros(1), None, None, None, None, 6, 8), {})


def _sana_plan_with_halo(key: str):
    plan = dtp.load_plan("sana")
    return dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, halo=(HaloRule(key, 2),)))


@pytest.mark.parametrize(
    "key, match",
    [
        ("transformer_blocks.*.ff.conv_inverted", None),  # a 1 x 1 conv needs 0 rows: allowed
        ("transformer_blocks.*.attn1.to_q", "must be an nn.Conv1d/2d/3d"),
        ("patch_embed.proj", None),
    ],
)
def test_halo_targets_are_checked_at_resolve(key, match):
    model = tiny_model(SANA)
    plan = _sana_plan_with_halo(key)
    if match is None:
        resolve_cp(resolve(plan, model), model)
        return
    with pytest.raises(dtp.PlanError, match=match):
        resolve_cp(resolve(plan, model), model)


def test_halo_on_a_strided_conv_is_a_plan_error():
    """A stride-2 conv's output rows do not line up with the rank's input rows: refused before anything changes."""
    model = tiny_model(SANA)
    model.transformer_blocks[0].ff.conv_depth.stride = (2, 2)
    with pytest.raises(dtp.PlanError, match="stride 2"):
        resolve_cp(resolve(dtp.load_plan("sana"), model), model)


def test_linear_attention_has_no_ulysses_head_rule():
    """Sana 1.6B's 70 linear-attention heads at cp=8: no Ulysses all-to-all, so no (heads / tp) % cp rule."""
    model = tiny_model(SANA, num_attention_heads=6, attention_head_dim=8, cross_attention_dim=48)
    cp_resolved = resolve_cp(resolve(dtp.load_plan("sana"), model), model)
    assert [s.path for s in cp_resolved.attention] == ["transformer_blocks.0.attn1", "transformer_blocks.1.attn1"]
    assert all(s.linear for s in cp_resolved.attention)
    cp_resolved.check(1, 4, "ulysses")  # 6 heads, cp=4: refused for softmax attention, fine here
    assert [path for path, _, _ in cp_resolved.halos] == [f"transformer_blocks.{i}.ff.conv_depth" for i in (0, 1)]
