"""The ranks one cache decision is made over, and the two collectives that make it rank-consistent.

A cache hook decides per call from a tensor (FirstBlockCache: the first block's residual change,
`mean|r - r_prev| / mean|r_prev|`). In one process the tensor is whole; on a mesh it is cut:

    cp axis         each rank holds a slice of the sequence        -> reduce the sums over `cp`
    cfg axis, batch each cfg group holds rows of a doubled batch   -> reduce the sums over `cfg` too
    cfg axis, pair  each group runs a whole call of its own branch -> nothing to reduce over `cfg`
    tp axis         activations are replicated                     -> nothing to reduce

A global mean is then sum(local sums) / sum(local counts), the value the one-process hook computes
(up to the order of the additions). Whatever the metric, the decision itself is agreed last over every
rank that runs the same forward (`agree_any`: compute when any rank would), so no rank can skip a block
whose collectives its peers enter, whatever the metric's numerics.

Host reads: a metric is read once per decision (diffusers' own hook reads it once too, `.item()`); the decision
is agreed as a host integer on gloo groups beside the mesh's (`host`, from `runtime.cfg.host.axis_groups`), so
the agreement itself waits for no GPU kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.cfg import CFG_ATTR
from ..runtime.cfg import host as host_side
from ..runtime.mesh import CFG_AXIS, CP_AXIS, TP_AXIS


@dataclass(frozen=True)
class DecisionScope:
    """The mesh of one sharded model, and the model (its cfg wrapper says whether a batch is being split).

    split_cp: reduce metrics over the `cp` axis (False only in the negative control of the tests).
    host: {axis name: host group} for the agreements (None: the mesh's own groups, device tensors).
    """

    mesh: object
    model: object
    split_cp: bool = True
    host: dict | None = None

    def _axes(self, names) -> list:
        present = self.mesh.mesh_dim_names or ()
        return [self.mesh[name].get_group() for name in names if name in present and self.mesh[name].size() > 1]

    def _batch_split(self) -> bool:
        wrapper = getattr(self.model, CFG_ATTR, None)
        return wrapper is not None and wrapper.batch_split

    def split_groups(self) -> list:
        """The groups over which the tensor of this call is cut (see the module docstring)."""
        names = ([CP_AXIS] if self.split_cp else []) + ([CFG_AXIS] if self._batch_split() else [])
        return self._axes(names)

    def _forward_axes(self) -> list[str]:
        return [CP_AXIS, TP_AXIS] + ([CFG_AXIS] if self._batch_split() else [])

    def forward_groups(self) -> list:
        """The groups whose ranks all run this call's forward (and its collectives) together."""
        return self._axes(self._forward_axes())

    def batch_group(self):
        """The cfg group while the cfg wrapper splits this call's batch over it, else None."""
        return self._axes([CFG_AXIS])[0] if self._batch_split() and self._axes([CFG_AXIS]) else None

    def same_over_cp(self, tensors: list[torch.Tensor]) -> bool:
        """Whether every cp rank holds the same tensors, by a fixed-size float64 fingerprint (count, elements, and
        the sums, weighted sums and sums of squares of the values), all-gathered over cp."""
        sums = torch.stack([t.detach().double().sum() for t in tensors])
        squares = torch.stack([t.detach().double().square().sum() for t in tensors])
        weights = torch.arange(1, len(tensors) + 1, dtype=torch.float64, device=sums.device)
        numel = float(sum(t.numel() for t in tensors))
        counts = torch.tensor([float(len(tensors)), numel], dtype=torch.float64, device=sums.device)
        mine = torch.cat([counts, torch.stack([sums.sum(), (weights * sums).sum(), squares.sum()])])
        differ = torch.zeros((), dtype=torch.bool, device=mine.device)
        groups = self._axes([CP_AXIS] if self.split_cp else [])
        for group in groups:
            seen = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
            dist.all_gather(seen, mine, group=group)
            differ = differ | (torch.stack(seen) != mine).any()
        return not groups or not bool(differ)  # one read for every group

    def means(self, *tensors: torch.Tensor) -> list[float]:
        """The mean of each tensor over its whole (uncut) extent, the same float on every rank."""
        sums = torch.stack([t.detach().double().sum() for t in tensors])
        counts = torch.tensor([float(t.numel()) for t in tensors], dtype=torch.float64, device=sums.device)
        totals = torch.cat([sums, counts])
        for group in self.split_groups():
            dist.all_reduce(totals, group=group)
        return (totals[: len(tensors)] / totals[len(tensors) :]).tolist()

    def agree_any(self, flag: bool, device) -> bool:
        """True on every rank of the forward when it is True on any of them (on the host groups when there are)."""
        if self.host is not None:
            groups = [self.host[name] for name in self._forward_axes() if name in self.host]
            return bool(host_side.max_ints([int(flag)], groups)[0])
        value = torch.full((1,), int(flag), dtype=torch.int64, device=device)
        for group in self.forward_groups():
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return bool(value.item())
