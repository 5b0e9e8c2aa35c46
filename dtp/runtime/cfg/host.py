"""The cfg axis's host-side exchanges: small integers (decision flags, output shapes) on a CPU process group.

Shapes and decisions are host data. Sending them through the mesh's own (NCCL) group would copy them to the
GPU and read them back, and that read waits for every kernel queued before it: the transformer's whole forward.
So `install_cfg` makes gloo groups once, beside the mesh's (`host_groups`), and these functions run on them
with CPU tensors, leaving the GPU's queue alone:

    mesh (cuda, cfg=2 x tp=2, ranks 0..3)    span: one gloo group of ranks 0..3  (the flag agreement)
                                             cfg:  gloo groups {0, 2} and {1, 3} (the shape headers)
                                             per axis: gloo lines (dtp.cache's agreements, `axis_groups`)
    mesh (cpu)                               the mesh's own gloo groups (already host memory)

`dist.new_group` must be entered by every rank of the world, so a device mesh that does not span the world
keeps its own groups and device tensors (correct, but the reads then wait for the GPU); so does a mesh on
torch's fake process group (`dtp check`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..mesh import CFG_AXIS
from ..placement import local_device


@dataclass(frozen=True)
class HostGroups:
    """Process groups for host-side integers: `span` reduced in turn cover the mesh; `cfg` is this rank's cfg axis."""

    span: tuple
    cfg: object
    device: str = "cpu"  # where the integers' tensors live: "cpu", or the mesh's device on its own (NCCL) groups


def host_groups(mesh, *, separate: bool | None = None) -> HostGroups:
    """The groups the cfg axis exchanges host integers on (see the module docstring); `separate` forces new gloo
    groups (True) or the mesh's own (False); None: new ones for a non-CPU mesh that spans the world."""
    spans_world = mesh.size() == dist.get_world_size()
    if separate is None:
        separate = _separate(mesh)
    if not separate:
        device = "cpu" if mesh.device_type == "cpu" else str(local_device(mesh.device_type))
        return HostGroups(span=tuple(mesh_spanning_groups(mesh)), cfg=mesh[CFG_AXIS].get_group(), device=device)
    assert spans_world, "dist.new_group needs every rank of the world"
    return HostGroups(span=(dist.new_group(backend="gloo"),), cfg=_gloo_axis(mesh, CFG_AXIS))


def _separate(mesh) -> bool:
    """New gloo groups for a device mesh that spans a real world (torch's fake process group has no peers)."""
    return mesh.device_type != "cpu" and mesh.size() == dist.get_world_size() and dist.get_backend() != "fake"


def axis_groups(mesh, *, separate: bool | None = None) -> dict | None:
    """{axis name: this rank's host group along it} for every named axis of size > 1 (dtp.cache's agreements);
    `separate` as in `host_groups`; None for a device mesh without side groups (agree on the device then)."""
    if separate is None:
        separate = _separate(mesh)
    if not separate and mesh.device_type != "cpu":
        return None
    names = [name for name in mesh.mesh_dim_names or () if mesh[name].size() > 1]
    return {name: _gloo_axis(mesh, name) if separate else mesh[name].get_group() for name in names}


def _gloo_axis(mesh, name: str):
    """A new gloo group of this rank's line along axis `name` (every rank of the world enters every line's)."""
    axis = mesh.mesh_dim_names.index(name)
    lines = mesh.mesh.movedim(axis, -1).reshape(-1, mesh.shape[axis]).tolist()  # the ranks of each line
    group, _ = dist.new_subgroups_by_enumeration(lines, backend="gloo")
    return group


def mesh_spanning_groups(mesh) -> list:
    """Groups whose successive reductions cover the mesh: the world for a `make_mesh` mesh, else each axis."""
    if mesh.size() == dist.get_world_size():
        return [dist.group.WORLD]
    return [mesh.get_group(axis) for axis in range(mesh.ndim) if mesh.size(axis) > 1]


def min_ints(values: list[int], groups, device: str = "cpu") -> list[int]:
    """The elementwise minimum of `values` over every rank of `groups` (all ranks get the same list); tensors on
    `device` (the CPU on host groups). The ProcessGroups' own calls (as `styles.collectives` issues tp's): this runs
    twice per pair of transformer calls, and `dist.all_reduce`'s checks and loggers cost more than the exchange."""
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    for group in groups:
        _process_group(group).allreduce([tensor], _MIN).wait()
    return tensor.tolist()


def max_ints(values: list[int], groups) -> list[int]:
    """The elementwise maximum of `values` over every rank of `groups` (CPU tensors)."""
    tensor = torch.tensor(values, dtype=torch.int64)
    for group in groups:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


def gather_ints(values: list[int], size: int, group, device: str = "cpu") -> list[list[int]]:
    """`values` (at most `size` of them, padded with -1) of every rank of `group`, in group rank order: one tensor
    built from the padded list, one all-gather into one buffer, one read."""
    assert len(values) <= size
    group = _process_group(group)
    mine = torch.tensor(values + [-1] * (size - len(values)), dtype=torch.int64, device=device)
    gathered = mine.new_empty(group.size() * size)
    group.all_gather_single(gathered, mine).wait()
    flat = gathered.tolist()
    return [flat[at : at + size] for at in range(0, len(flat), size)]


_MIN = dist.AllreduceOptions()
_MIN.reduceOp = dist.ReduceOp.MIN


def _process_group(group):
    """`group` as a ProcessGroup (None: the world's)."""
    return dist.group.WORLD if group is None else group
