"""Which node each rank runs on, and the rule that latency-bound axes stay inside one node.

tp all-reduces a layer's activations twice per block and Ulysses all-to-alls q, k, v and the output of every
attention: both are small, frequent and on the critical path, so across an inter-node link (tens of GB/s against
NVLink's hundreds) they dominate the step. cfg exchanges one output per step and ring overlaps its K/V transfer
with a block's compute, so those axes may cross nodes. `make_mesh` lays axes out row-major with tp innermost, and
torchrun gives each node consecutive ranks, so tp groups stay inside a node exactly when the node size is a
multiple of tp; this module checks that instead of assuming it:

    2 nodes x 2 ranks, tp=2: tp groups {0, 1} {2, 3}  -> each inside a node: accepted
    2 nodes x 2 ranks, tp=4: tp group {0, 1, 2, 3}   -> spans node 0 and node 1: PlanError naming "tp"

A rank's node is torchrun's `GROUP_RANK` (the agent's node rank: two agents on one host are two nodes, as a test
launches them) with the host name, exchanged once over the default group when the mesh is made.
"""

from __future__ import annotations

import os
import socket

import torch.distributed as dist

from ..errors import PlanError

INTRA_NODE_AXES = ("ulysses", "tp")  # axes whose groups must not cross a node unless the user allows it


def node_of_this_rank() -> str:
    """This rank's node: "<host>/<torchrun node rank>" (the node rank alone tells two agents on one host apart)."""
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"


def rank_nodes() -> list[str]:
    """The node of every rank of the default group, in rank order (one all-gather of small strings)."""
    nodes: list = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node_of_this_rank())
    return nodes


def axis_groups(mesh, axis: str) -> list[list[int]]:
    """The global ranks of every group along `axis` of `mesh` (each a list, in axis order)."""
    names = list(mesh.mesh_dim_names)
    moved = mesh.mesh.movedim(names.index(axis), -1)
    return moved.reshape(-1, moved.shape[-1]).tolist()


def check_axes_within_nodes(mesh, nodes: list[str], allow: tuple[str, ...] = (), held: dict | None = None) -> None:
    """PlanError when a group of an intra-node axis (tp, Ulysses) spans ranks of several nodes, unless its axis
    is in `allow`. held: {axis: the mesh axis holding it} (plain Ulysses, `make_mesh(cp=C, ulysses=C)`: the
    Ulysses groups are the `cp` axis's: {"ulysses": "cp"})."""
    held = held or {}
    for axis in INTRA_NODE_AXES:
        name = held.get(axis, axis)
        if name not in (mesh.mesh_dim_names or ()) or axis in allow or mesh[name].size() == 1:
            continue
        for group in axis_groups(mesh, name):
            spanned = sorted({nodes[rank] for rank in group})
            if len(spanned) > 1:
                per_node = max(sum(nodes[r] == node for r in range(len(nodes))) for node in spanned)
                raise PlanError(
                    f"make_mesh: the {axis} group of ranks {group} spans {len(spanned)} nodes ({', '.join(spanned)}); "
                    f"{axis} traffic is latency-bound and would cross the inter-node link on every layer. Choose "
                    f"{axis} <= {per_node} (ranks per node) so each group stays inside a node, put the extra degree on "
                    f"cp (ring) or cfg, or pass allow_cross_node=('{axis}',) to accept it."
                )


def check_mesh_nodes(mesh, allow: tuple[str, ...] = (), held: dict | None = None) -> None:
    """`check_axes_within_nodes` with the nodes read from the launch; skipped on one rank or torch's fake group
    (full-size analysis builds meshes of any size in one process)."""
    if dist.get_world_size() == 1 or dist.get_backend() == "fake":
        return
    check_axes_within_nodes(mesh, rank_nodes(), allow, held)
