"""The sharded forward on plain tensors: a parameter's local tensor and the two tp collectives it issues.

Parameters stay DTensors at rest (state dicts, LoRA, checkpoints, `full_tensor`, the loader, FSDP2's unshard);
the forward reads their local tensors and issues its collective itself, the shape of vLLM's
`ColumnParallelLinear` / `RowParallelLinear`. Through DTensor the same Linear cost 130 µs (colwise) and 516 µs
(rowwise) of host time against 38 µs plain, and the rowwise output was copied whole inside the functional
all-reduce (research/gpu-path-review.md, P2).

The collectives run in place on the fresh matmul output (no copy), synchronously, in one of two forms:
- eager: the ProcessGroup's own `allreduce` / `all_gather_single` and `Work.wait()`, the call
  `torch.distributed.all_reduce` ends in without its Python checks and loggers: 6-16 µs against 37-47 µs for
  `dist.all_reduce` / `dist.all_gather_single`, 61 µs for the in-place functional op and its wait, 460-550 µs for
  `funcol.all_reduce` (an AsyncCollectiveTensor), on a fake process group on one loaded core;
- under `torch.compile`: `dist.all_reduce` / `dist.all_gather_single`, which dynamo rewrites to the in-place
  functional collectives (`traceable_collective_remaps`), so `fullgraph=True` traces them (the raw
  `_c10d_functional.all_reduce_` op does not functionalize under AOTAutograd).
Synchronous on every device: on NCCL a wait makes the compute stream wait on the collective, not the host; and every
output's consumer is the very next op (the rowwise bias, the gate multiply, AdaLN's chunk), so a deferred wait would
have nothing to overlap. Under gloo, deferred waits were seen to corrupt the heap now and then.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor


def local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's plain tensor of a DTensor (a parameter at rest), or `tensor` itself when plain (or None).

    Without grad and outside compile it is the DTensor's own local tensor: `to_local()` on a Parameter makes a fresh
    view each call to keep the Parameter flag (~10 µs, against 0.1 µs). With grad, `to_local()` carries the gradient
    back to the DTensor; under compile it is what dynamo traces."""
    if not isinstance(tensor, DTensor):
        return tensor
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return tensor.to_local()
    return tensor._local_tensor


def all_reduce(tensor: torch.Tensor, group) -> torch.Tensor:
    """Sum `tensor` over `group` in place (it must be a fresh tensor nobody else reads); returns it."""
    if torch.compiler.is_compiling():
        dist.all_reduce(tensor, group=group)
    else:
        group.allreduce([tensor]).wait()
    return tensor


def all_gather_last(tensor: torch.Tensor, group, size: int | None = None) -> torch.Tensor:
    """The rank pieces of `tensor` ([..., k] on each of `size` ranks) concatenated in rank order along the last dim:
    one all-gather into a [size * d0, ..., k] buffer, then `along_last`."""
    size = group.size() if size is None else size
    return along_last(_all_gather_rows(tensor, group, size), size)


def all_gather_along(tensor: torch.Tensor, group, dim: int) -> torch.Tensor:
    """Every rank's `tensor` concatenated along `dim` in rank order (as `torch.cat`): one all-gather. When the dims
    before `dim` are all 1 (or `dim` is 0) the rank order along `dim` is the memory order of the gathered rows: it
    gathers straight into the result (e.g. cp's output gather: [1, 4096, 64] on 2 ranks -> [1, 8192, 64]); else into a
    `[size * d0, ...]` buffer, then one copy moves the rank dim next to `dim`."""
    size, dim = group.size(), dim % tensor.ndim
    tensor = tensor.contiguous()
    shape = (*tensor.shape[:dim], size * tensor.shape[dim], *tensor.shape[dim + 1 :])
    if math.prod(tensor.shape[:dim]) == 1:
        out = tensor.new_empty(shape)
        _all_gather_into(out.view(size * tensor.shape[0], *tensor.shape[1:]), tensor, group)
        return out
    stacked = _all_gather_rows(tensor, group, size).view(size, *tensor.shape)
    return stacked.movedim(0, dim).reshape(shape)


def _all_gather_rows(tensor: torch.Tensor, group, size: int) -> torch.Tensor:
    """Every rank's `tensor` stacked along dim 0 (`[size * d0, ...]`)."""
    tensor = tensor.contiguous()
    gathered = tensor.new_empty((size * tensor.shape[0], *tensor.shape[1:]))
    _all_gather_into(gathered, tensor, group)
    return gathered


def _all_gather_into(gathered: torch.Tensor, tensor: torch.Tensor, group) -> None:
    """Every rank's contiguous `tensor` into `gathered` (`[size * d0, ...]`, rank order): the ProcessGroup's
    all-gather in eager, `dist.all_gather_single` (traced) under compile."""
    if torch.compiler.is_compiling():
        dist.all_gather_single(gathered, tensor, group=group)
    else:
        group.all_gather_single(gathered, tensor).wait()


_ALL_TO_ALL = dist.AllToAllOptions()  # default options, built once: a fresh one cost ~7 µs of host a call


def all_to_all(tensor: torch.Tensor, group) -> torch.Tensor:
    """Equal-split all-to-all of `tensor` (dim 0 is `size` chunks, chunk j to rank j) over `group`; synchronous.

    Eager: the ProcessGroup's `alltoall_base` into a fresh buffer (7 µs of host on a fake process group against 264 µs
    for `funcol.all_to_all_single` and its wait); under compile the functional op, which dynamo traces."""
    if torch.compiler.is_compiling():
        return funcol.wait_tensor(funcol.all_to_all_single(tensor, None, None, group))
    tensor = tensor.contiguous()
    out = torch.empty_like(tensor)
    group.alltoall_base(out, tensor, [], [], _ALL_TO_ALL).wait()
    return out


def send_to_next(tensor: torch.Tensor, group) -> tuple:
    """Start one ring step: group rank m sends `tensor` to m + 1 and receives rank m - 1's (mod size, same shape).

    `wait_for` the result when the next step first reads it, so the transfer overlaps the compute issued in between.
    Eager: the ProcessGroup's `alltoall_base` with one non-empty split each way (`funcol.permute_tensor`'s exchange,
    issued async: ~10 µs of host against ~290 µs), its Work waited for in `wait_for`, the send buffer held until then;
    under compile `funcol.permute_tensor`, which dynamo traces, its wait placed where the result is first read (in
    `wait_for`, after the compute in between)."""
    size = group.size()
    if torch.compiler.is_compiling():
        sent = tensor.contiguous().view(-1)
        return funcol.permute_tensor(sent, [(m + 1) % size for m in range(size)], group), None, None, tensor.shape
    # The split sizes count dim-0 rows: all of them go to one peer, so the tensor is sent in its own shape (no
    # flattening view on the way out, none on the way back).
    sent = tensor.contiguous()
    rank, received = group.rank(), torch.empty_like(sent)
    recv_splits, send_splits = [0] * size, [0] * size
    recv_splits[(rank - 1) % size] = send_splits[(rank + 1) % size] = sent.shape[0]
    work = group.alltoall_base(received, sent, recv_splits, send_splits, _ALL_TO_ALL)
    return received, work, sent, None


def wait_for(started: tuple) -> torch.Tensor:
    """The tensor `send_to_next` receives, in the sent shape, once its transfer is done."""
    received, work, _, shape = started
    if work is not None:
        work.wait()
    return received if shape is None else received.view(shape)


def along_last(stacked: torch.Tensor, size: int) -> torch.Tensor:
    """`size` pieces stacked on dim 0 ([size * d0, ..., k]) concatenated on the last dim instead ([d0, ..., size * k]).

    e.g. AdaLN's [1, 6 * 3072 / 4] at tp=4 gathered as [4, 4608] -> [1, 18432]: a view, since with one row the rank
    order is already the feature order; with more rows, [size, d0, ..., k] -> [d0, ..., size, k] is one copy."""
    *rows, width = stacked.shape
    rows[0] //= size
    if stacked.numel() == size * width:
        return stacked.view(*rows, size * width)
    return stacked.view(size, *rows, width).movedim(0, -2).reshape(*rows, size * width)


class TpGroup:
    """The process group of a 1-D tp mesh, looked up once (`DeviceMesh.get_group` costs µs per call).

    A copy (deepcopy, pickle) keeps the mesh and looks the group up again: a ProcessGroup cannot be copied."""

    def __init__(self, mesh):
        self.mesh = mesh
        # Looked up now, not at the first call: a lazy lookup is a guard (`_group is None`) that flips after the
        # first forward, so a compiled block would recompile once per block instance.
        self._group = mesh.get_group()
        self.rank = mesh.get_local_rank()

    @property
    def group(self):
        if self._group is None:
            self._group = self.mesh.get_group()
        return self._group

    @property
    def size(self) -> int:
        return self.mesh.size()

    def __getstate__(self):
        return {"mesh": self.mesh, "_group": None, "rank": self.rank}
