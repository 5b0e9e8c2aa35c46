"""Suggested plans at tp=2 on 2 gloo processes: exact at every planned site, and really sharded."""

import pytest
from suggest_cases import cases, run_cases

from dtp.analysis.verify import merge
from dtp.testing.launch import spawn

CLASSES = sorted(cases())
# Latte's cross-attention over the caption is sharp at the tiny config's random weights: the suggested plan's
# rounding upstream (1e-7..2e-6 at each site) reaches that attention's output at 2.7e-5 (measured; the bundled plan
# measures 6.1e-6 there) while the model output stays at 8.5e-7, within 1e-5 like every class. Every other site: 1e-5.
SITE_TOL = {"LatteTransformer3DModel": 1e-4}


@pytest.fixture(scope="module")
def results():
    ranks = spawn(run_cases, 2)
    return {
        cls: (merge([r[cls]["compare"] for r in ranks], model=cls, tol=SITE_TOL.get(cls, 1e-5)), ranks[0][cls])
        for cls in CLASSES
    }


@pytest.mark.parametrize("cls", CLASSES)
def test_suggested_plan_is_exact(results, cls):
    """Tiny config, tp=2, plan from dtp.suggest_plan: every planned Linear's input and output, every attention
    output and the model output within 1e-5 relative of the single-process reference, on both ranks (Latte's
    sites: SITE_TOL)."""
    report, _ = results[cls]
    assert report.ok, report.format()
    assert report.output_rel <= 1e-5


BUNDLED = [
    "FluxTransformer2DModel",
    "Flux2Transformer2DModel",
    "QwenImageTransformer2DModel",
    "ZImageTransformer2DModel",
]


@pytest.mark.parametrize("cls", BUNDLED)
def test_suggested_plan_really_shards(results, cls):
    """A rank holds at most 0.75 of the weight bytes at tp=2 (bundled plans: about 0.5)."""
    _, rank0 = results[cls]
    assert rank0["share"] <= 0.75, rank0["rules"]


def test_most_classes_really_shard(results):
    """All but one class (Wan: QK-norm across heads keeps attention whole) shard, and at least 12 once the tiny
    configs cover that many classes; the rest refuse or shard only what is exact (test above)."""
    sharded = [cls for cls in CLASSES if results[cls][1]["share"] <= 0.75]
    assert len(sharded) >= min(12, len(CLASSES) - 1), sharded


def test_wan_qk_norm_across_heads_is_distributed(results):
    """Wan's q/k are normalized across heads: since issue 35 suggest plans them rmsnorm_across_heads with their
    attention pairs (exact: test above); the FFN shards as before."""
    _, rank0 = results["WanTransformer3DModel"]
    assert rank0["rules"]["blocks.*.attn1.norm_q"] == ("rmsnorm_across_heads", None), rank0["rules"]
    assert rank0["rules"]["blocks.*.attn1.to_q"] == ("colwise", None)
    assert rank0["rules"]["blocks.*.ffn.net.0.proj"] == ("colwise", None)
    assert rank0["rules"]["blocks.*.ffn.net.2"] == ("rowwise", None)
