"""Re-tying a tied Parameter after its modules were sharded one by one (see resolve/ties.py)."""

from __future__ import annotations

from torch import nn


def retie(model: nn.Module, ties) -> None:
    """Every name of each group gets the first name's (sharded) Parameter, so one slice stays per rank."""
    for names in ties:
        shared = model.get_parameter(names[0])
        for name in names[1:]:
            path, _, leaf = name.rpartition(".")
            model.get_submodule(path).register_parameter(leaf, shared)
