"""Which of dynamo's guards a compiled block of a sharded model does without: the DTensor specs of its parameters.

A block's sharded parameters stay DTensors at rest (`styles/parallel.py`), so each one is an input of the block's
graph and dynamo guards it with `DTENSOR_SPEC_MATCH`: a Python lambda comparing its mesh and placements, run on
every call of every block (tiny Wan at tp=2: 24 a block, ~140 µs of a 1.1 ms compiled forward). The graph does not
depend on them: a module dtp runs on local tensors (a planned Linear or conv, `STYLE_ATTR`, or a
`ShardedRMSNorm`) reads `_local_tensor` / `to_local()` of its parameters, which ignores mesh and placements, and
issues its collectives on its style's group, which dynamo guards on its own. dtp never changes a parameter's
placements once its style is installed, and a local tensor of another shape is still caught (the block's tensor
guards and inductor's input asserts). So these guards are dropped, and only these: a DTensor read through DTensor
math in the graph (a weight quantized after sharding goes through torchao's subclass over DTensors, its bias through
DTensor `F.linear`) keeps its spec guard, as does every other guard.
"""

from __future__ import annotations

import re

from torch import nn
from torch.distributed.tensor import DTensor

from ..styles.parallel import STYLE_ATTR
from .norms import ShardedRMSNorm

SPEC_GUARD = "DTENSOR_SPEC_MATCH"
# `self._modules['attn1']._modules['to_q']._parameters['weight']._spec`: a parameter's own spec, read off the block
_PARAM_SPEC = re.compile(r"^self((?:\._modules\['[^']+'\])*)\._parameters\['([^']+)'\]\._spec$")
_MODULE_KEY = re.compile(r"\._modules\['([^']+)'\]")


def reads_local_tensors(module: nn.Module) -> bool:
    """`module`'s forward computes on its parameters' local tensors only (module docstring)."""
    if isinstance(module, ShardedRMSNorm):
        return True
    return STYLE_ATTR in module.__dict__ and isinstance(module._parameters.get("weight"), DTensor)


def local_param_spec(block: nn.Module, name: str) -> bool:
    """Whether the guard source `name` is the spec of a parameter of one of `block`'s local-tensor modules."""
    match = _PARAM_SPEC.match(name)
    if match is None:
        return False
    path = ".".join(_MODULE_KEY.findall(match.group(1)))
    try:
        module = block.get_submodule(path)
    except AttributeError:
        return False
    return isinstance(module._parameters.get(match.group(2)), DTensor) and reads_local_tensors(module)


def guard_filter(block: nn.Module):
    """A `guard_filter_fn` for `torch.compile(block.forward, options=...)`: keep every guard but the DTensor specs of
    `block`'s local-tensor parameters (read when dynamo builds a graph's guards, on the module as it is then)."""

    def keep(entries) -> list[bool]:
        return [e.guard_type != SPEC_GUARD or not local_param_spec(block, e.name) for e in entries]

    return keep
