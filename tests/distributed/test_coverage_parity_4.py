"""Issue 10 coverage at tp=4: every plan added for it on 4 gloo processes against a single-process reference."""

import pytest
from coverage_cases import plan_params, run_cases
from test_coverage_parity import DATA_DEPENDENT, TOL, expected_counts

from dtp.testing.launch import spawn

PLAN_PARAMS = plan_params(4)  # each kind's family at tp=2 (test_coverage_parity.py) or tp=4 by default


@pytest.fixture(scope="module")
def results():
    return spawn(run_cases, 4, 4)


@pytest.mark.parametrize("name", PLAN_PARAMS)
def test_parity(results, name):
    """Tiny config (4 heads; Lumina2 4 kv heads), batch 2, tp=4: max |sharded - ref| <= 1e-5 * max |ref|, every rank."""
    for rank_results in results:
        assert rank_results[name] <= TOL, (name, rank_results[name])


@pytest.mark.parametrize("name", PLAN_PARAMS)
def test_ranks_issue_the_same_collectives(results, name):
    """All 4 ranks issue the same collectives (op and bytes) in the same order; counts as at tp=2 (the same extras)."""
    first = results[0][f"{name}/collectives"]
    assert all(r[f"{name}/collectives"]["sequence"] == first["sequence"] for r in results)
    if name not in DATA_DEPENDENT:
        assert first["measured"] == expected_counts(name, first["implied"])


@pytest.mark.full  # the same controls run at tp=2 by default (test_coverage_parity.py)
def test_negative_controls(results):
    """Per-rank QK-norm misses parity by > 100x the bound; uncut RoPE raises."""
    assert all(r["wan/per_rank_qk_norm"] > 100 * TOL for r in results)
    assert all(r["ltx_video/rope_uncut"] == "PlanError" for r in results)  # refused by prepare, before sharding
