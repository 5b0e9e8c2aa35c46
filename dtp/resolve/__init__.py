"""Resolving: a plan bound to a model -> layouts, head bookkeeping and constraints. Reads shapes, mutates nothing.

layout.py     `Layout`, the one home of the slicing math (styles, loader, quantization, LoRA use it)
binding/      the plan bound to the model's shapes: `resolve` -> `Resolved`; `resolve_cp` -> `CpResolved`
transforms/   exact rewrites of a `Resolved` for a tp degree: head padding, shared kv heads
exactness/    checks that run the bound plan (meta forward, head alignment); their bounded memo
"""

from .binding.constraints import Constraint
from .binding.cp import CpResolved, resolve_cp
from .binding.globs import expand
from .binding.heads import AttentionSpec
from .binding.linears import LinearSpec
from .binding.norms import NormSpec
from .binding.resolved import Resolved, resolve
from .exactness.memo import clear_caches
from .layout import Layout

__all__ = [
    "AttentionSpec",
    "Constraint",
    "CpResolved",
    "Layout",
    "LinearSpec",
    "NormSpec",
    "Resolved",
    "clear_caches",
    "expand",
    "resolve",
    "resolve_cp",
]
