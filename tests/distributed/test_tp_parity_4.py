"""Tensor parallelism on 4 gloo processes: tp=4, and tp=2 on the `tp` axis of a (cp=2, tp=2) mesh."""

import pytest
from tp_cases import run_cases

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run

TOL = 1e-5
CASES = [
    "flux/yaml",
    "flux/diffusers",
    "flux2/yaml",
    "flux2/diffusers",
    "qwenimage/yaml",
    "qwenimage/diffusers",
    "zimage/yaml",
]


def _both_meshes(rank, world_size):
    # Two meshes over the same 4-process group: one spawn for every 4-rank check. diffusers' own `_tp_plan` runs on
    # the (2, 2) mesh's `tp` axis alone (no cp section): tp=2 as test_tp_parity_2.py runs it, so with DTP_FULL=1 only.
    return {"tp4": run_cases(rank, world_size, 4, 1), "cp2tp2": run_cases(rank, world_size, 2, 2, full_run())}


@pytest.fixture(scope="module")
def results():
    return spawn(_both_meshes, 4)


@pytest.mark.parametrize("case", CASES)
def test_parity_tp4(results, case):
    """Tiny config, tp=4: max |sharded - ref| <= 1e-5 * max |ref| on every rank."""
    for rank_results in results:
        assert rank_results["tp4"][case] <= TOL, (case, rank_results["tp4"][case])


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.full) if c.endswith("/diffusers") else c for c in CASES]
)
def test_parity_cp2_tp2(results, case):
    """Tiny config, (cp=2, tp=2) mesh: TP on `tp` (+ the plan's CP on `cp`): same bound on all 4 ranks."""
    for rank_results in results:
        assert rank_results["cp2tp2"][case] <= TOL, (case, rank_results["cp2tp2"][case])


def test_tp4_reassembly_and_local_heads(results):
    assert all(r["tp4"]["flux2/packed_reassembly"] for r in results)
    assert results[0]["tp4"]["local_heads"] == {"heads": 1, "inner_dim": 16, "inner_kv_dim": 16}
    assert results[0]["cp2tp2"]["local_heads"] == {"heads": 2, "inner_dim": 32, "inner_kv_dim": 32}


def test_negative_control_wrong_split_is_visible_at_tp4(results):
    """Flux2's fused SwiGLU split as one block runs at tp=4 (and on the (2, 2) mesh) but is visibly wrong."""
    for mesh in ("tp4", "cp2tp2"):
        assert all(r[mesh]["flux2/plain_colwise_swiglu"] > 1e-2 for r in results), mesh
