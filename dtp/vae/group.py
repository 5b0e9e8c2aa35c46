"""The process group of a parallel VAE: every rank of the mesh, its axes flattened."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


def vae_group(mesh):
    """A ProcessGroup over all ranks of `mesh` (a DeviceMesh of any shape, or a ProcessGroup as is).

    A ("cp", "tp") mesh of 2 x 4 gives one group of 8 ranks, in the mesh's row-major order. A mesh
    over the whole world is the default group; a smaller one is flattened by DeviceMesh (collective:
    every rank of the default group calls this, as every rank calls `parallelize_vae`).
    """
    if not isinstance(mesh, DeviceMesh):
        return mesh
    if mesh.ndim == 1:
        return mesh.get_group()
    ranks = mesh.mesh.flatten().tolist()
    if ranks == list(range(dist.get_world_size())):
        return dist.group.WORLD
    return mesh._flatten().get_group()
