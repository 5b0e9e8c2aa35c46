"""parallelize(): resolve and check everything, then shard in place on the mesh's `tp` axis."""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from .heads import set_local_heads
from .mesh import tp_submesh
from .placement import check_device, local_device
from .plan import Plan
from .plan_io import plan_for
from .resolve import Resolved, resolve
from .styles import style_for


def _resolve(model: nn.Module, plan: Plan | None) -> Resolved:
    return resolve(plan if plan is not None else plan_for(model), model)


def parallelize(model: nn.Module, mesh, plan: Plan | None = None, *, device=None) -> nn.Module:
    """Shard `model` in place with `plan` (default: `plan_for(model)`) on `mesh`'s `tp` axis; returns it.

    Every check (paths, styles, blocks, heads, pairs, the TP degree) runs before the first
    parameter is replaced: a call that raises PlanError leaves the model as it was.

    `device` (a device, or a type such as "cuda" meaning cuda:<local rank>, see
    `placement.local_device`) is for a model loaded whole on CPU: each sharded parameter's slice is
    cut on CPU and only the slice is moved; replicated parameters and buffers are moved whole.
    """
    tp_mesh = tp_submesh(mesh)
    resolved = _resolve(model, plan)
    resolved.check_tp(tp_mesh.size())
    if device is not None:
        device = local_device(device)
        check_device(device, tp_mesh)
    apply_resolved(model, resolved, tp_mesh, device=device)
    return model


def apply_resolved(model: nn.Module, resolved: Resolved, tp_mesh, *, device=None) -> None:
    """Install the styles and rewrite head counts. Only called after every check passed.

    With `device`, the sharded slices are placed there, then everything still elsewhere
    (replicated parameters, buffers) follows.
    """
    for spec in resolved.linears:
        parallelize_module(model.get_submodule(spec.path), tp_mesh, style_for(spec, device))
    set_local_heads(model, resolved.attention, tp_mesh.size())
    if device is not None:
        move_unsharded(model, device)


def move_unsharded(model: nn.Module, device) -> None:
    """Move every plain (non-DTensor) parameter and buffer of `model` to `device`, in place."""
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and not isinstance(param.data, DTensor) and param.device != device:
                module._parameters[name] = nn.Parameter(param.data.to(device), requires_grad=param.requires_grad)
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def tp_candidates(model: nn.Module, plan: Plan | None = None) -> list[int]:
    """The TP degrees `model` supports under `plan` (default: `plan_for(model)`), e.g. [1, 2, 4, 8]."""
    return _resolve(model, plan).candidates()
