"""Issue 45: the remaining DiT classes of diffusers 0.42.1 that got a plan this round, tiny config, batch 2 (a
left-padded prompt), tp=2 on 2 gloo processes against one process. Their tp=4 parity and collectives are
test_coverage_parity_4.py's / test_coverage_parity.py's (with DTP_FULL=1), `dtp suggest`
test_coverage_2026_suggest.py's."""

import pytest
from dits_cases import run_dits

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32


@pytest.fixture(scope="module")
def results():
    return spawn(run_dits, 2)


def test_omnigen_is_exact(results):
    """OmniGen at tp=2: the heads' output reshaped to the rewritten attn.out_dim, the vocabulary split with the pad
    id in the last rank's rows (measured 2.4e-7)."""
    assert all(r["omnigen"] <= TOL for r in results), [r["omnigen"] for r in results]


def test_negative_control_omnigen_out_dim_left_global_is_refused(results):
    """Without out_dim rewritten per rank the processor's reshape to the global width cannot run: prepare's flow check
    refuses the plan naming the attention module, before anything is sharded."""
    outcomes = [r["omnigen/out_dim_global"] for r in results]
    assert all(o.startswith("PlanError") and "self_attn" in o for o in outcomes), outcomes
