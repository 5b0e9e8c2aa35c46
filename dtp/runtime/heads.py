"""Rewriting attention modules' head counts and widths to their per-rank values (see resolve/heads.py)."""

from __future__ import annotations

from torch import nn


def set_local_heads(model: nn.Module, specs, tp: int) -> None:
    """Rewrite each spec'd module's counts and widths to their per-rank values."""
    for spec in specs:
        module = model.get_submodule(spec.path)
        for attr, value in spec.local_values(tp).items():
            setattr(module, attr, value)
