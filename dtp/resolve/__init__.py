"""Resolving: a plan bound to a model -> layouts, head bookkeeping and constraints. Reads shapes, mutates nothing."""

from .constraints import Constraint
from .cp import CpResolved, resolve_cp
from .globs import expand
from .heads import AttentionSpec
from .layout import Layout
from .linears import LinearSpec
from .norms import NormSpec
from .resolved import Resolved, resolve

__all__ = [
    "AttentionSpec",
    "Constraint",
    "CpResolved",
    "Layout",
    "LinearSpec",
    "NormSpec",
    "Resolved",
    "expand",
    "resolve",
    "resolve_cp",
]
