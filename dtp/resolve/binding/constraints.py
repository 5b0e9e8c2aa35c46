"""Numbers the TP degree must divide, and the two questions asked of them: which degrees, and does this one fit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import PlanError
from ...policy import check_degree

_SHOWN = 3  # failing constraints named in one error message


@dataclass(frozen=True)
class Constraint:
    """A number the TP degree must divide, with enough context for an error message.

    `shareable`: a kv head count that a multiple of it also serves (each kv head then shared by
    tp / kv ranks, resolve/kv_share.py): 4 kv heads allow tp 1, 2, 4 and 8, 12, 16, ...
    """

    value: int
    what: str  # e.g. "heads of transformer_blocks.0.attn" or "packed block 3 of ...to_qkv_mlp_proj"
    key: str  # the plan key (or `attention` entry) responsible
    shareable: bool = False

    def allows(self, tp: int) -> bool:
        return self.value % tp == 0 or (self.shareable and tp % self.value == 0)


def candidates(constraints) -> list[int]:
    """Every TP degree all constraints allow ([1] when there are none).

    Without shareable kv heads these are the divisors of the gcd; the plain constraints bound the
    search (a model has query heads next to its kv heads), else the largest shareable count does.
    """
    constraints = list(constraints)
    g = 0
    for c in constraints:
        if not c.shareable:
            g = math.gcd(g, c.value)
    bound = g or max((c.value for c in constraints), default=1)
    return [d for d in range(1, bound + 1) if all(c.allows(d) for c in constraints)]


def check_divides(constraints, tp, plan_name: str, hint: str = "") -> None:
    """PlanError naming the numbers `tp` does not divide (the first few, with their keys) and the supported degrees.

    `hint` ends the message (e.g. "Or pass pad=True ...", see `padding.check_unpadded`).
    """
    check_degree(tp, f"plan {plan_name}: tp")
    failed = [c for c in constraints if not c.allows(tp)]
    if not failed:
        return
    shown = "; ".join(f"{c.what}={c.value} (key '{c.key}')" for c in failed[:_SHOWN])
    more = f"; and {len(failed) - _SHOWN} more" if len(failed) > _SHOWN else ""
    supported = ", ".join(map(str, candidates(constraints)))
    raise PlanError(f"plan {plan_name}: tp={tp} does not divide {shown}{more}. Supported tp: {supported}.{hint}")
