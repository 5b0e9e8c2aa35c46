"""The cfg axis: the guidance branches (and a batch of prompts) of each transformer call on different ranks."""

from .hooks import BRANCH_ATTR, PER_CONTEXT, SHARED, branch_state, stateful_hooks, unvouched
from .wrapper import CFG_ATTR, CfgParallel, CfgStats, check_cfg, check_predictions, install_cfg, remove_cfg

__all__ = [
    "BRANCH_ATTR",
    "CFG_ATTR",
    "PER_CONTEXT",
    "SHARED",
    "CfgParallel",
    "CfgStats",
    "branch_state",
    "check_cfg",
    "check_predictions",
    "install_cfg",
    "remove_cfg",
    "stateful_hooks",
    "unvouched",
]
