"""The 2-D ("cp", "tp") DeviceMesh: context parallelism on `cp`, tensor parallelism on `tp`."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..errors import PlanError
from ..policy import check_degree, default_device_type

CP_AXIS = "cp"
TP_AXIS = "tp"


def make_mesh(tp: int, cp: int = 1, device_type: str | None = None) -> DeviceMesh:
    """A ("cp", "tp") mesh over the initialized process group; world size must equal cp * tp.

    Ranks are laid out row-major: with cp=2, tp=2 ranks {0, 1} and {2, 3} form the tp groups, so
    tensor-parallel traffic stays between neighbouring ranks (usually the same node).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "make_mesh needs an initialized process group: launch with torchrun and call "
            "torch.distributed.init_process_group() first."
        )
    for name, value in ((TP_AXIS, tp), (CP_AXIS, cp)):
        check_degree(value, f"make_mesh: {name}")
    world = dist.get_world_size()
    if world != cp * tp:
        raise PlanError(
            f"make_mesh: world size {world} != cp * tp = {cp} * {tp} = {cp * tp}; "
            f"launch {cp * tp} processes or choose cp, tp with cp * tp = {world}."
        )
    return init_device_mesh(device_type or default_device_type(), (cp, tp), mesh_dim_names=(CP_AXIS, TP_AXIS))


def tp_submesh(mesh: DeviceMesh) -> DeviceMesh:
    """The `tp` axis of a ("cp", "tp") mesh, or a 1-D mesh named "tp" itself."""
    names = mesh.mesh_dim_names or ()
    if mesh.ndim == 1 and names == (TP_AXIS,):
        return mesh
    if TP_AXIS in names:
        return mesh[TP_AXIS]
    raise PlanError(
        f"mesh axes {names or '(unnamed)'} have no '{TP_AXIS}' axis; build the mesh with dtp.make_mesh(tp=..., cp=...)."
    )


def cp_degree(mesh: DeviceMesh) -> int:
    """The size of the mesh's `cp` axis (1 for a tp-only mesh)."""
    names = mesh.mesh_dim_names or ()
    return mesh[CP_AXIS].size() if CP_AXIS in names and mesh.ndim > 1 else 1
