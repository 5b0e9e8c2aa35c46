"""parallelize(): resolve and check everything, then shard in place on the mesh's `tp` axis (and `cp`)."""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from .cp import apply_cp, check_mode, resolve_cp
from .heads import set_local_heads
from .mesh import CP_AXIS, tp_submesh
from .placement import check_device, local_device
from .plan import Plan
from .plan_io import plan_for
from .resolve import Resolved, resolve
from .styles import style_for


def _resolve(model: nn.Module, plan: Plan | None) -> Resolved:
    return resolve(plan if plan is not None else plan_for(model), model)


def parallelize(
    model: nn.Module, mesh, plan: Plan | None = None, *, cp_mode: str = "ulysses", device=None
) -> nn.Module:
    """Shard `model` in place with `plan` (default: `plan_for(model)`) on `mesh`'s `tp` axis; returns it.

    When the mesh's `cp` axis is larger than 1, the plan's `cp` section splits the sequence over it
    and attention runs as `cp_mode`: "ulysses" (all-to-all, needs (heads / tp) % cp == 0) or "ring"
    (K/V passed around the ring, any head count). Every check (paths, styles, blocks, heads, pairs,
    the TP degree, the cp section and mode, the device) runs before the first parameter is replaced
    or hook installed: a call that raises PlanError leaves the model as it was.

    `device` (a device, or a type such as "cuda" meaning cuda:<local rank>, see
    `placement.local_device`) is for a model loaded whole on CPU: each sharded parameter's slice is
    cut on CPU and only the slice is moved; replicated parameters and buffers are moved whole.
    """
    check_mode(cp_mode)
    tp_mesh = tp_submesh(mesh)
    resolved = _resolve(model, plan)
    resolved.check_tp(tp_mesh.size())
    if device is not None:
        device = local_device(device)
        check_device(device, tp_mesh)
    cp_resolved = check_cp(model, resolved, mesh, tp_mesh.size(), cp_mode)
    apply_resolved(model, resolved, tp_mesh, device=device)
    if cp_resolved is not None:
        apply_cp(model, cp_resolved, mesh[CP_AXIS], cp_mode)
    return model


def check_cp(model: nn.Module, resolved: Resolved, mesh, tp: int, cp_mode: str):
    """The resolved cp section when the mesh's `cp` axis is > 1 (checked at this tp), else None."""
    cp = _cp_degree(mesh)
    if cp == 1:
        return None
    cp_resolved = resolve_cp(resolved, model)
    cp_resolved.check(tp, cp, cp_mode)
    return cp_resolved


def _cp_degree(mesh) -> int:
    names = mesh.mesh_dim_names or ()
    return mesh[CP_AXIS].size() if CP_AXIS in names and mesh.ndim > 1 else 1


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


def tp_candidates(model: nn.Module, plan: Plan | None = None, *, cp: int = 1, cp_mode: str = "ulysses") -> list[int]:
    """The TP degrees `model` supports under `plan` (default: `plan_for(model)`), e.g. [1, 2, 4, 8].

    With `cp > 1`, only the degrees that also work with that many context-parallel ranks in
    `cp_mode` (Ulysses: (heads / tp) % cp == 0; the plan needs a `cp` section).
    """
    return cp_aware_candidates(model, _resolve(model, plan), cp, cp_mode)


def cp_aware_candidates(model: nn.Module, resolved: Resolved, cp: int, cp_mode: str, *, tp: int | None = None) -> list[int]:
    """`resolved.candidates()` narrowed to the degrees that work with `cp` ranks in `cp_mode`.

    With `tp`, the plan's cp section is first checked at (tp, cp): PlanError when it does not fit.
    """
    if cp == 1:
        return resolved.candidates()
    check_mode(cp_mode)
    cp_resolved = resolve_cp(resolved, model)
    if tp is not None:
        cp_resolved.check(tp, cp, cp_mode)
    return [t for t in resolved.candidates() if cp_resolved.allows(t, cp, cp_mode)]
