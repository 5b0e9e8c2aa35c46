"""Planning data: the plan vocabulary, its parsing, and where plans come from. No torch.distributed."""

from .io import bundled_plan_names, bundled_plans_for, find_plan, load_plan, plan_for
from .plan import Plan
from .types import Rule, Style

__all__ = [
    "Plan",
    "Rule",
    "Style",
    "bundled_plan_names",
    "bundled_plans_for",
    "find_plan",
    "load_plan",
    "plan_for",
]
