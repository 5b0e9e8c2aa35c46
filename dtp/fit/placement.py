"""Where a candidate's ranks sit on `nodes` x `gpus_per_node` GPUs, and which of its axes cross a node boundary.

The ranks of R replicas of a (cfg, cp, tp) mesh are laid out as `make_mesh` lays them, outermost to innermost

    replica, cfg, ring, ulysses, tp          (cp = ring x ulysses; fsdp: the non-tp axes flattened)

row-major over torchrun's ranks, which give each node `gpus_per_node` consecutive ranks. An axis crosses nodes when
one of its groups holds ranks of two nodes; tp and Ulysses must not (`runtime/nodes.py`'s rule, applied here to the
same layout: `check_axes_within_nodes` on a grid of rank numbers, no process group), the others may and then cost the
inter-node link (`cost.collective_seconds`). 4 nodes x 8 GPUs, cfg 2 x ring 4 x ulysses 2 x tp 2:

    tp        {0, 1}, {2, 3}, ...                     inside a node
    ulysses   {0, 2}, {1, 3}, {4, 6}, ...             inside a node
    ring      {0, 4, 8, 12}, ...                      ranks 0-7 on node 0, 8-15 on node 1: crosses
    cfg       {0, 16}, ...                            crosses
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import PlanError
from ..runtime.nodes import axis_groups, check_axes_within_nodes
from .hardware import InterNode

AXIS_ORDER = ("replica", "cfg", "ring", "ulysses", "tp")  # outermost to innermost
FSDP = "fsdp"  # FSDP2's axis: every non-tp axis of one replica, flattened
WORLD = "world"  # a collective over a replica's whole mesh (the cfg pair path's flags)


@dataclass(frozen=True)
class RankGrid:
    """The rank numbers of a mesh laid out row-major over named axes: what `runtime/nodes.py` reads of a DeviceMesh
    (`mesh`, `mesh_dim_names`, `grid[axis].size()`), without a process group."""

    sizes: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def mesh(self) -> torch.Tensor:
        return torch.arange(self.world).reshape(self.sizes)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return self.names

    @property
    def world(self) -> int:
        world = 1
        for size in self.sizes:
            world *= size
        return world

    def __getitem__(self, axis: str) -> _Axis:
        return _Axis(self.sizes[self.names.index(axis)])


@dataclass(frozen=True)
class _Axis:
    n: int

    def size(self) -> int:
        return self.n


@dataclass(frozen=True)
class Nodes:
    """`nodes` nodes of `gpus_per_node` GPUs joined by `link` (None: one node)."""

    nodes: int = 1
    gpus_per_node: int | None = None
    link: InterNode | None = None

    @property
    def gpus(self) -> int | None:
        return None if self.gpus_per_node is None else self.nodes * self.gpus_per_node

    def of_ranks(self, world: int) -> list[str]:
        """The node of every rank, in rank order (torchrun: consecutive ranks per node)."""
        per_node = self.gpus_per_node or world
        return [f"node {rank // per_node}" for rank in range(world)]


def grid(cfg: int, cp: int, tp: int, ulysses: int, replicas: int = 1) -> RankGrid:
    """The layout of `replicas` x (cfg, ring = cp / ulysses, ulysses, tp) (module docstring)."""
    sizes = dict(zip(AXIS_ORDER, (replicas, cfg, cp // ulysses, ulysses, tp)))
    return RankGrid(tuple(sizes.values()), tuple(sizes))


def check_within_nodes(layout: RankGrid, nodes: Nodes) -> None:
    """PlanError when a tp or Ulysses group of `layout` spans nodes (`runtime/nodes.py`'s message and rule)."""
    if nodes.nodes > 1:
        check_axes_within_nodes(layout, nodes.of_ranks(layout.world))


def crossing_axes(layout: RankGrid, nodes: Nodes) -> tuple[str, ...]:
    """The axes of `layout` (and "fsdp", "world" over one replica's ranks) with a group that spans nodes, in
    `AXIS_ORDER`; "replica" is left out (replicas exchange nothing)."""
    if nodes.nodes == 1:
        return ()
    where = nodes.of_ranks(layout.world)
    crossing = [a for a in layout.names[1:] if layout[a].size() > 1 and _spans(axis_groups(layout, a), where)]
    replica = layout.mesh.reshape(layout.sizes[0], -1)  # each row: one replica's ranks, (cfg, ring, ulysses) x tp
    tp = layout["tp"].size()
    if replica.shape[1] > tp and _spans([g for row in replica for g in row.reshape(-1, tp).T.tolist()], where):
        crossing.append(FSDP)
    if _spans(replica.tolist(), where):
        crossing.append(WORLD)
    return tuple(crossing)


def _spans(groups, where: list[str]) -> bool:
    return any(len({where[rank] for rank in group}) > 1 for group in groups)


def check_nodes(nodes: Nodes, world: int) -> None:
    """PlanError when the link cannot join `world` GPUs (NVL72: 72 at most)."""
    link = nodes.link
    if link is not None and link.max_gpus is not None and world > link.max_gpus:
        raise PlanError(
            f"dtp fit: {nodes.nodes} nodes x {nodes.gpus_per_node} GPUs = {world} GPUs, more than the {link.max_gpus} "
            f"one {link.name} fabric joins; choose --nodes <= {link.max_gpus // (nodes.gpus_per_node or 1)}."
        )
