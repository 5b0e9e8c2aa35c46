"""parallelize(): resolve and check everything, then shard in place on the mesh's `tp` axis."""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from .heads import set_local_heads
from .mesh import tp_submesh
from .plan import Plan
from .plan_io import plan_for
from .resolve import Resolved, resolve
from .styles import style_for


def _resolve(model: nn.Module, plan: Plan | None) -> Resolved:
    return resolve(plan if plan is not None else plan_for(model), model)


def parallelize(model: nn.Module, mesh, plan: Plan | None = None) -> nn.Module:
    """Shard `model` in place with `plan` (default: `plan_for(model)`) on `mesh`'s `tp` axis; returns it.

    Every check (paths, styles, blocks, heads, pairs, the TP degree) runs before the first
    parameter is replaced: a call that raises PlanError leaves the model as it was.
    """
    tp_mesh = tp_submesh(mesh)
    resolved = _resolve(model, plan)
    resolved.check_tp(tp_mesh.size())
    apply_resolved(model, resolved, tp_mesh)
    return model


def apply_resolved(model: nn.Module, resolved: Resolved, tp_mesh) -> None:
    """Install the styles and rewrite head counts. Only called after every check passed."""
    for spec in resolved.linears:
        parallelize_module(model.get_submodule(spec.path), tp_mesh, style_for(spec))
    set_local_heads(model, resolved.attention, tp_mesh.size())


def tp_candidates(model: nn.Module, plan: Plan | None = None) -> list[int]:
    """The TP degrees `model` supports under `plan` (default: `plan_for(model)`), e.g. [1, 2, 4, 8]."""
    return _resolve(model, plan).candidates()
