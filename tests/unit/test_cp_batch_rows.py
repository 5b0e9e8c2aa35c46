"""`cp.batch_rows` (`runtime/cp/batch_rows.py`): each rank's share of a whole batch's rows, ceil(n / cp) a rank,
the short shares at the end. Independent construction: the shares of every rank, in rank order, are the rows 0..n-1
exactly once (np.array_split's order, with the empty shares last)."""

from __future__ import annotations

import pytest

from dtp import PlanError
from dtp.plan.cp import cp_plan_from_mapping
from dtp.runtime.cp.batch_rows import rows_of


@pytest.mark.parametrize("n,cp", [(8, 8), (5, 8), (77, 8), (10, 4), (2, 4), (1, 2)])
def test_the_shares_cover_every_row_once_in_order(n, cp):
    shares = [rows_of(n, rank, cp) for rank in range(cp)]
    assert [row for start, stop, _ in shares for row in range(start, stop)] == list(range(n))
    assert all(stop - start <= c == -(-n // cp) for start, stop, c in shares)


def test_the_plan_takes_a_list_of_module_paths():
    data = {"split": {"blocks.0": {"x": {"dim": 1}}}, "gather": {"proj_out": {"dim": 1}}}
    assert cp_plan_from_mapping({**data, "batch_rows": ["motion_encoder"]}, "x").batch_rows == ("motion_encoder",)
    with pytest.raises(PlanError, match="batch_rows must be a list"):
        cp_plan_from_mapping({**data, "batch_rows": {"motion_encoder": 0}}, "x")
