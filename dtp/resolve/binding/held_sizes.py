"""Sizes held on non-attention modules that a sharded width must match: refused before anything is sharded.

dtp rewrites the head counts and widths of attention modules to each rank's values (`runtime/heads.py`);
a size held anywhere else stays whole. When a module's own code reads such a size to cut or view an
activation a planned Linear leaves sharded, every rank's forward asks for the whole width of a local
tensor: a crash, or a cut in the wrong place. Example: OvisImage's single blocks split `proj_mlp`'s
output with `torch.split(x, [self.mlp_hidden_dim] * 2)`. Planned `packed_colwise` [1, 1] at tp=2 (tiny:
mlp_hidden_dim 256), each rank's output is 256 wide and the split asks for 2 x 256.

The check needs no forward and no example inputs. An integer attribute of a module enclosing a planned
Linear inside its block (up to the ModuleList element; never the model) whose output stays sharded (role
"colwise"; a gathered output is whole again) is refused when

    it equals the Linear's output width or one of its packed blocks,
    it differs from the Linear's input width (a width of the replicated stream: Flux's `dim` when q is dim wide),
    the module is no attention module (those sizes are rewritten per rank), and
    the module's own code reads it outside `__init__` (`self.<name>` in a method's source).

FluxSingleTransformerBlock also holds `mlp_hidden_dim` (= proj_mlp's width) but never reads it after
`__init__`: not refused.
"""

from __future__ import annotations

import inspect
import re
from functools import cache

from torch import nn

from ...errors import PlanError
from .heads import attention_spec
from .resolved import Resolved


def check_held_sizes(resolved: Resolved, model: nn.Module) -> None:
    """PlanError for the first size held on an enclosing module that a sharded output must match. Mutates nothing."""
    for spec in resolved.linears:
        if spec.style.role != "colwise" or spec.style.shard_dim != 0:
            continue
        linear = model.get_submodule(spec.path)
        widths = {sum(spec.sizes), *spec.sizes} - {linear.weight.shape[1]}
        for owner_path, owner in _enclosing(model, spec.path):
            for name, value in _read_sizes(owner):
                if value in widths:
                    raise PlanError(_message(resolved, spec, owner_path, owner, name, value))


def _enclosing(model: nn.Module, path: str):
    """(path, module) of the modules above `path` inside its block, nearest first: up to the element of the nearest
    ModuleList (a block), never the model itself, attention modules left out. A size held further up (the model's
    `vocab_size`) describes the whole model, not this block's activations, and would match widths by chance."""
    atoms = path.split(".")
    for depth in range(len(atoms) - 1, 0, -1):
        owner_path = ".".join(atoms[:depth])
        owner = model.get_submodule(owner_path)
        if isinstance(owner, nn.ModuleList):
            return
        if attention_spec(owner_path, owner, "") is None:
            yield owner_path, owner


def _read_sizes(module: nn.Module) -> list[tuple[str, int]]:
    """The module's integer attributes (bools aside) that its methods read after `__init__`."""
    sizes = [(n, v) for n, v in vars(module).items() if isinstance(v, int) and not isinstance(v, bool) and v > 1]
    read = _names_read(type(module))
    return [(n, v) for n, v in sizes if n in read]


@cache
def _names_read(cls: type) -> frozenset[str]:
    """Every `self.<name>` read in the methods of `cls` and its nn.Module bases, `__init__` aside."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass in (nn.Module, object) or not issubclass(klass, nn.Module):
            continue
        for attr, func in vars(klass).items():
            if attr == "__init__" or not inspect.isfunction(func):
                continue
            try:
                source = inspect.getsource(func)
            except (OSError, TypeError):  # built without source (compiled, generated): nothing seen
                continue
            names.update(re.findall(r"\bself\.(\w+)\b", source))
    return frozenset(names)


def _message(resolved, spec, owner_path, owner, name, value) -> str:
    where = f"'{owner_path}.{name}'" if owner_path else f"'{name}' (on the model)"
    return (
        f"plan {resolved.plan.name}, key '{spec.rule.key}': {type(owner).__name__} holds {where} = {value}, the "
        f"width of a block of '{spec.path}' that the plan leaves sharded ({spec.style} {list(spec.sizes)}), and "
        f"reads it in its forward; dtp rewrites sizes on attention modules only, so every rank would cut or view "
        f"its local {value} // tp features as {value}. Leave '{spec.rule.key}' (and its rowwise partner) "
        f"replicated, or shard it with colwise_gathered."
    )
