"""dtp.verify on 2 gloo processes: right plans pass; each wrong plan is named at the module that is wrong."""

import pytest
from verify_cases import CASES, run_cases

from dtp.analysis.verify import merge
from dtp.testing.launch import spawn


@pytest.fixture(scope="module")
def reports():
    results = spawn(run_cases, 2)
    return {name: merge([r[name] for r in results], model=CASES[name][0]) for name in CASES}


@pytest.mark.parametrize("case", ["flux2/bundled", "zimage/bundled", "flux/bundled"])
def test_bundled_plan_passes(reports, case):
    """Tiny config, tp=2: every planned Linear's input and output, every attention output and the model
    output within 1e-5 relative of the single-process reference (per rank, after the plan's slicing)."""
    report = reports[case]
    assert report.ok, report.format()
    assert len([s for s in report.sites if s.kind == "attention"]) >= 3
    assert report.output_rel <= 1e-5


def test_plain_colwise_swiglu_is_named(reports):
    """linear_in's output matches its (wrong) plan layout, so the first divergence is linear_out's input,
    and the suspect is the colwise layer feeding it."""
    report = reports["flux2/plain_colwise_swiglu"]
    assert report.first.label() == "input of transformer_blocks.0.ff.linear_out", report.format()
    assert report.suspects() == ["transformer_blocks.0.ff.linear_in"]
    assert "colwise (sizes [384])" in report.entries["transformer_blocks.0.ff.linear_in"]
    assert report.output_rel > 1e-2


def test_wrong_packed_split_is_named(reports):
    """The fused QKV/MLP blocks cut at the wrong places: single block 0's attention and its projection."""
    report = reports["flux2/wrong_packed_split"]
    assert report.error is None
    assert report.first.label() == "input of single_transformer_blocks.0.attn.to_out", report.format()
    assert report.suspects() == ["single_transformer_blocks.0.attn", "single_transformer_blocks.0.attn.to_qkv_mlp_proj"]
    # Everything before the single-stream blocks is right.
    before = report.sites[: report.sites.index(report.first)]
    assert before and all(s.rel <= 1e-5 for s in before)


def test_dropped_head_bookkeeping_is_named(reports):
    """Z-Image's processor reshapes with attn.heads: the global count on local q/k/v fails in layers.0.attention."""
    report = reports["zimage/heads_dropped"]
    assert not report.ok
    assert report.suspects() == ["layers.0.attention"], report.format()
    assert "not listed" in report.entries["layers.0.attention"]


def test_swapped_pair_is_named(reports):
    """net.0.proj rowwise / net.2 colwise in block 0 only: the run fails in block 0's net.0.proj."""
    report = reports["flux/swapped_pair"]
    assert not report.ok
    assert report.suspects() == ["transformer_blocks.0.ff.net.0.proj"], report.format()


def test_qk_norm_across_heads_left_replicated_is_named(reports):
    """Wan's norm_q/norm_k over all 64 features see 32 per rank: the attention of block 0 and its q/k/v are named."""
    report = reports["wan/qk_norm_replicated"]
    assert not report.ok
    suspects = report.suspects()
    assert suspects[0] == "blocks.0.attn1", report.format()
