"""Context parallelism on the `cp` axis of the ("cp", "tp") mesh: sequence split + Ulysses or ring attention."""

from .apply import apply_cp, remove_cp
from .attention import CP_MODES
from .plan import CpPlan, GatherRule, SplitRule, cp_plan_from_mapping
from .resolve import CpResolved, check_mode, resolve_cp

__all__ = [
    "CP_MODES", "CpPlan", "CpResolved", "GatherRule", "SplitRule", "apply_cp", "check_mode", "cp_plan_from_mapping",
    "remove_cp", "resolve_cp",
]
