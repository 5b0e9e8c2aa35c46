"""One value for the parallel setup: the mesh, its axes, and the options every sharded module shares.

torchtitan's `ParallelDims` is the model: built once at each entry point (`prepare`, the loader, the
pipeline), then asked for `tp_mesh`, `cp`, ... wherever needed, so no signature carries `mesh, cp_mode,
device, pad` loose and no submesh rule is written twice. The public keyword arguments of `dtp.parallelize`,
`dtp.from_pretrained`, ... stay as they are; they are folded into a `Parallelism` at the entry.

Submesh rules (one home):
- a diffusers model takes the whole ("cp", "tp") mesh: TP on `tp`, its plan's sequence split on `cp`;
- a transformers model (a text encoder) takes the `tp` axis only: it has no `cp` section and runs the
  same on every cp rank and every cfg group (`for_model`);
- the `cfg` axis (outermost) pairs the ranks at one (cp, tp) place of each cfg group: a denoiser's guidance
  branches run on different groups (`runtime/cfg`).
A new axis is a property here plus its submesh rule in `mesh.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..plan.transformers import is_transformers_model
from ..policy import check_cp_mode
from .mesh import CP_AXIS, cfg_degree, cp_degree, tp_submesh


@dataclass(frozen=True)
class Parallelism:
    """The mesh and the options of one sharding.

    mesh: the ("cp", "tp") or ("cfg", "cp", "tp") DeviceMesh (or a 1-D "tp" mesh) the model is sharded on;
        each cfg group holds the same weights, TP and CP work on the inner axes of this rank's group.
    cp_mode: context-parallel attention, "ulysses" or "ring" (used when the `cp` axis is > 1).
    pad: zero-pad heads and widths the TP degree does not divide (exact).
    device: where slices (and then everything else) go; None leaves parameters where they are.
    """

    mesh: object
    cp_mode: str = "ulysses"
    pad: bool = False
    device: torch.device | None = None

    @classmethod
    def build(cls, mesh, *, cp_mode: str = "ulysses", pad: bool = False, device=None) -> Parallelism:
        """Check the mesh (a `tp` axis) and the options, then fold them into one value. PlanError otherwise."""
        tp_submesh(mesh)
        check_cp_mode(cp_mode)
        return cls(mesh, cp_mode, pad, device)

    @property
    def tp_mesh(self):
        """The `tp` axis: every planned module's weights are split over it."""
        return tp_submesh(self.mesh)

    @property
    def tp(self) -> int:
        return self.tp_mesh.size()

    @property
    def cp(self) -> int:
        """The size of the `cp` axis (1 without one)."""
        return cp_degree(self.mesh)

    @property
    def cfg(self) -> int:
        """The number of cfg groups (the `cfg` axis; 1 without one): guidance branches on different groups."""
        return cfg_degree(self.mesh)

    @property
    def cp_mesh(self):
        """The `cp` axis (only when `cp` > 1)."""
        return self.mesh[CP_AXIS]

    def for_model(self, model: nn.Module) -> Parallelism:
        """The setup `model` is sharded with: a text encoder on the `tp` axis only, a diffusers model on all."""
        return replace(self, mesh=model_mesh(model, self.mesh))

    def with_device(self, device) -> Parallelism:
        return replace(self, device=device)


def model_mesh(model: nn.Module, mesh):
    """The mesh a model is sharded on: the whole one for a diffusers model, the `tp` axis for a text encoder."""
    return tp_submesh(mesh) if is_transformers_model(model) else mesh
