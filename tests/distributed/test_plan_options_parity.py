"""Issue 45: bundled plans follow their class's config options. Each family built under an option that changes which
modules exist (Wan 2.2 Animate without added_kv_proj_dim, Wan 2.1 I2V's image branch, ...) runs its bundled plan at
tp=2 on 2 gloo processes against one process. The typo controls are tests/unit/test_plan_options.py's."""

import pytest
from plan_options_cases import DEFAULT_CASES, FULL_CASES, case_id, run_options

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32


@pytest.fixture(scope="module")
def results():
    return spawn(run_options, 2)


CASES = [case_id(*c) for c in DEFAULT_CASES] + [pytest.param(case_id(*c), marks=pytest.mark.full) for c in FULL_CASES]


@pytest.mark.parametrize("case", CASES)
def test_plan_is_exact_under_the_option(results, case):
    """Tiny config with the option flipped, batch 2, tp=2: max |sharded - ref| <= 1e-5 * max |ref| on every rank."""
    assert all(isinstance(r[case], float) and r[case] <= TOL for r in results), [r[case] for r in results]
