"""diffusers' cache hooks on a dtp mesh: the same steps skipped on every rank as in one process.

dtp does not cache anything itself: it checks which cache runs exactly on which axes (`kinds`), makes the
inputs of each hook's decision rank-consistent (`scope`, `consistent`), routes `enable_cache` on a sharded
model through those (`enable`), and names the caches for the CLI (`names`). See docs/cache.md.
"""

from .enable import attach, check_cache, enable
from .kinds import KINDS, check_config, refusal
from .names import CACHE_NAMES, apply_cache, make_config
from .scope import DecisionScope

__all__ = [
    "CACHE_NAMES",
    "KINDS",
    "DecisionScope",
    "apply_cache",
    "attach",
    "check_cache",
    "check_config",
    "enable",
    "make_config",
    "refusal",
]
