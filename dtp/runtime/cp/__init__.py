"""Context parallelism at run time on the `cp` axis: sequence split/gather hooks + Ulysses or ring attention."""

from .apply import apply_cp, move_cp_hooks, remove_cp

__all__ = ["apply_cp", "move_cp_hooks", "remove_cp"]
