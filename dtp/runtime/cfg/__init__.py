"""The cfg axis: the guidance branches (and a batch of prompts) of each transformer call on different ranks."""

from .wrapper import CFG_ATTR, CfgParallel, CfgStats, check_cfg, install_cfg, remove_cfg

__all__ = ["CFG_ATTR", "CfgParallel", "CfgStats", "check_cfg", "install_cfg", "remove_cfg"]
