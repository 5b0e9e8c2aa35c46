"""The DeviceMesh: context parallelism on `cp`, tensor parallelism on `tp`, guidance branches on `cfg`.

`make_mesh(tp, cp)` builds ("cp", "tp"); with cfg > 1 an outer axis comes first: ("cfg", "cp", "tp").
Each cfg group (one index on the `cfg` axis) is a whole ("cp", "tp") grid holding the same weights;
`tp_submesh` and `cp_degree` read the inner axes of this rank's group, so everything that works on a
("cp", "tp") mesh works per cfg group unchanged.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..errors import PlanError
from ..policy import check_degree, default_device_type
from .nodes import INTRA_NODE_AXES, check_mesh_nodes

CFG_AXIS = "cfg"
CP_AXIS = "cp"
TP_AXIS = "tp"
RING_AXIS, ULYSSES_AXIS = "ring", "ulysses"
USP_ATTR = "_dtp_usp"  # on a `make_mesh(cp=C, ulysses=U)` mesh: this rank's (ring group, Ulysses group)


def usp_groups(mesh) -> tuple | None:
    """`(ring group, Ulysses group)` of a USP mesh (`make_mesh(ulysses=U)`, 1 < U < cp), or None. A side mesh
    (cfg, ring, ulysses, tp) over the same ranks holds the groups; the mesh itself keeps its flat `cp` axis, so
    everything that reads "cp" (splits, gathers, masks, cp_degree) is unchanged."""
    return getattr(mesh, USP_ATTR, None)


def make_mesh(
    tp: int = 1,
    cp: int = 1,
    cfg: int = 1,
    device_type: str | None = None,
    *,
    allow_cross_node=(),
    ulysses: int | None = None,
) -> DeviceMesh:
    """A ("cp", "tp") mesh, or ("cfg", "cp", "tp") when cfg > 1, over the initialized process group;
    world size must equal cfg * cp * tp.

    Ranks are laid out row-major: with cp=2, tp=2 ranks {0, 1} and {2, 3} form the tp groups, so
    tensor-parallel traffic stays between neighbouring ranks (usually the same node); with cfg=2, tp=2
    ranks {0, 1} are cfg group 0 and {2, 3} cfg group 1 (the cfg exchange pairs rank 0 with 2, 1 with 3).

    Launched on several nodes, a tp group spanning two nodes is a PlanError (`runtime/nodes.py`) unless
    `allow_cross_node` names the axis (a tuple of axis names, or True for every axis).

    ulysses: USP (Ulysses x ring) when 1 < ulysses < cp (ulysses divides cp): the `cp` ranks are laid out
    (ring, ulysses), Ulysses innermost (consecutive cp ranks, a node's), ring degree cp / ulysses; CP attention then
    runs Ulysses all-to-all inside each group of `ulysses` ranks and ring attention over the groups, whatever
    `cp_mode`. cp=4, ulysses=2, tp=1: Ulysses groups {0, 1}, {2, 3}; ring groups {0, 2}, {1, 3}. None, 1 or cp: the
    plain mesh (`cp_mode` "ring" is ulysses=1, "ulysses" is ulysses=cp); ulysses=cp also checks the `cp` groups as
    Ulysses groups against the nodes (`dtp run` passes it for --cp-mode ulysses).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "make_mesh needs an initialized process group: launch with torchrun and call "
            "torch.distributed.init_process_group() first."
        )
    for name, value in ((TP_AXIS, tp), (CP_AXIS, cp), (CFG_AXIS, cfg)):
        check_degree(value, f"make_mesh: {name}")
    world = dist.get_world_size()
    if world != cfg * cp * tp:
        raise PlanError(
            f"make_mesh: world size {world} != cfg * cp * tp = {cfg} * {cp} * {tp} = {cfg * cp * tp}; "
            f"launch {cfg * cp * tp} processes or choose cfg, cp, tp with cfg * cp * tp = {world}."
        )
    device_type = device_type or default_device_type()
    if cfg == 1:
        mesh = init_device_mesh(device_type, (cp, tp), mesh_dim_names=(CP_AXIS, TP_AXIS))
    else:
        mesh = init_device_mesh(device_type, (cfg, cp, tp), mesh_dim_names=(CFG_AXIS, CP_AXIS, TP_AXIS))
    allow = INTRA_NODE_AXES if allow_cross_node is True else tuple(allow_cross_node or ())
    check_mesh_nodes(mesh, allow, {ULYSSES_AXIS: CP_AXIS} if ulysses == cp else None)  # plain Ulysses: cp's groups
    if ulysses is not None and ulysses not in (1, cp):
        _usp_mesh(mesh, device_type, cfg, cp, tp, ulysses, allow)
    return mesh


def _usp_mesh(mesh: DeviceMesh, device_type: str, cfg: int, cp: int, tp: int, ulysses: int, allow) -> None:
    """Build the (cfg, ring, ulysses, tp) side mesh over the same ranks and register this rank's groups."""
    check_degree(ulysses, "make_mesh: ulysses")
    if cp % ulysses:
        raise PlanError(
            f"make_mesh: ulysses={ulysses} does not divide cp={cp}; the ring degree is cp / ulysses. Choose a divisor "
            f"of {cp}."
        )
    shape, names = (cp // ulysses, ulysses, tp), (RING_AXIS, ULYSSES_AXIS, TP_AXIS)
    if cfg > 1:
        shape, names = (cfg, *shape), (CFG_AXIS, *names)
    usp = init_device_mesh(device_type, shape, mesh_dim_names=names)
    check_mesh_nodes(usp, allow)
    # on the mesh object, not keyed by the cp group: torch hands a later mesh the same group (the world's default)
    setattr(mesh, USP_ATTR, (usp[RING_AXIS].get_group(), usp[ULYSSES_AXIS].get_group()))


def tp_submesh(mesh: DeviceMesh) -> DeviceMesh:
    """The `tp` axis of a ("cp", "tp") or ("cfg", "cp", "tp") mesh, or a 1-D mesh named "tp" itself."""
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


def cfg_degree(mesh: DeviceMesh) -> int:
    """The size of the mesh's `cfg` axis: the number of cfg groups (1 without a `cfg` axis)."""
    names = mesh.mesh_dim_names or ()
    return mesh[CFG_AXIS].size() if CFG_AXIS in names and mesh.ndim > 1 else 1


def cfg_submesh(mesh: DeviceMesh) -> DeviceMesh:
    """The `cfg` axis through this rank: the ranks at the same (cp, tp) place of every cfg group."""
    if cfg_degree(mesh) == 1:
        raise PlanError(
            f"mesh axes {mesh.mesh_dim_names or '(unnamed)'} have no '{CFG_AXIS}' axis of size > 1; build the "
            f"mesh with dtp.make_mesh(tp=..., cp=..., cfg=2)."
        )
    return mesh[CFG_AXIS]


FSDP_AXIS = "fsdp"  # the non-tp axes (cfg, cp) flattened: what FSDP shards weights over


def non_tp_submesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh's axes other than `tp` that are larger than 1, as one axis: ("cfg", "cp") flattened into "fsdp"
    (DeviceMesh `_flatten`; rank r of it is the r-th rank of this rank's tp place in row-major order), or the one
    such axis itself. PlanError when there is none (a tp-only mesh)."""
    names = [name for name in mesh.mesh_dim_names or () if name != TP_AXIS and mesh[name].size() > 1]
    if not names:
        raise PlanError(
            f"mesh axes {mesh.mesh_dim_names or '(unnamed)'} of shape {tuple(mesh.shape)} have no non-tp axis larger "
            f"than 1 to shard weights over; build the mesh with dtp.make_mesh(tp=..., cp=2) or cfg=2."
        )
    if len(names) == 1:
        return mesh[names[0]]
    return mesh[tuple(names)]._flatten(FSDP_AXIS)
