"""Which parameters of a model sharded with fsdp break dtp's rule: matrices FSDP2's, vectors whole on every rank.

Read from what torch holds, not from `runtime/fsdp.fsdp_shards`: FSDP2's own parameter groups (every unit's
`FSDPParam`, by module and name) and each parameter's DTensor placements. A parameter of 2 or more dimensions must be
in a unit's group and a DTensor sharded on a non-tp axis (Shard, or _StridedShard with TP inside); a vector (a bias,
a norm weight) in no group, and a plain tensor or a DTensor on the tp axis alone (as TP left it: Shard(0) for a
colwise bias, Replicate for a rowwise one). Used by tests/unit/test_fsdp_vectors.py and the gloo parity cases
(tests/distributed/fsdp_cases.py), right after sharding (the root's parameters are registered sharded until its first
call).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

TP_AXIS = "tp"


def fsdp_managed(model: nn.Module) -> set[tuple[int, str]]:
    """(id(module), name) of every parameter in one of FSDP2's parameter groups of `model` (all its units'), under
    each name it has (a tied one's too)."""
    states = {id(s): s for m in model.modules() if isinstance(m, FSDPModule) for s in [m._get_fsdp_state()]}
    groups = [s._fsdp_param_group for s in states.values() if s._fsdp_param_group is not None]
    infos = [p._module_info for g in groups for p in g.fsdp_params]
    return {
        (id(module), name)
        for info in infos
        for module, name in zip([info.module, *info.shared_modules], [info.param_name, *info.shared_param_names])
    }


def sharded_off_tp(param) -> bool:
    """Whether `param` is a DTensor sharded on an axis other than tp (FSDP2's fsdp axis: "cp", "cfg" or "fsdp")."""
    if not isinstance(param, DTensor):
        return False
    names = param.device_mesh.mesh_dim_names or ()
    kinds = [type(p).__name__ for p in param.placements]
    return any(name != TP_AXIS and kind in ("Shard", "_StridedShard") for name, kind in zip(names, kinds))


def rule_breaks(model: nn.Module) -> list[str]:
    """The names of `model`'s parameters that break the rule (module docstring), each with why."""
    managed, breaks = fsdp_managed(model), []
    for path, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            matrix = param.ndim >= 2
            in_group, off_tp = (id(module), name) in managed, sharded_off_tp(param)
            if in_group != matrix or off_tp != matrix:
                kind = "matrix" if matrix else "vector"
                breaks.append(f"{path}.{name} ({kind}: in FSDP2's group {in_group}, sharded off tp {off_tp})")
    return breaks
