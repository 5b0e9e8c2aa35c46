"""Numbers the TP degree must divide, and the two questions asked of them: which degrees, and does this one fit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import PlanError
from ..policy import check_degree

_SHOWN = 3  # failing constraints named in one error message


@dataclass(frozen=True)
class Constraint:
    """A number the TP degree must divide, with enough context for an error message."""

    value: int
    what: str  # e.g. "heads of transformer_blocks.0.attn" or "packed block 3 of ...to_qkv_mlp_proj"
    key: str  # the plan key (or `attention` entry) responsible


def candidates(constraints) -> list[int]:
    """Every TP degree that divides all constraints: the divisors of their gcd ([1] when there are none)."""
    g = 0
    for c in constraints:
        g = math.gcd(g, c.value)
    return [d for d in range(1, g + 1) if g % d == 0] if g else [1]


def check_divides(constraints, tp, plan_name: str, hint: str = "") -> None:
    """PlanError naming the numbers `tp` does not divide (the first few, with their keys) and the supported degrees.

    `hint` ends the message (e.g. "Or pass pad=True ...", see `padding.check_unpadded`).
    """
    check_degree(tp, f"plan {plan_name}: tp")
    failed = [c for c in constraints if c.value % tp]
    if not failed:
        return
    shown = "; ".join(f"{c.what}={c.value} (key '{c.key}')" for c in failed[:_SHOWN])
    more = f"; and {len(failed) - _SHOWN} more" if len(failed) > _SHOWN else ""
    supported = ", ".join(map(str, candidates(constraints)))
    raise PlanError(f"plan {plan_name}: tp={tp} does not divide {shown}{more}. Supported tp: {supported}.{hint}")
