"""The two collectives of the cfg axis: every group's output to every group, and one agreed decision.

`gather_parts(output, group)`: each rank's output tree, from every rank of its `cfg` group, in rank
order. Shapes may differ between ranks (an uneven batch split: 3 prompts over 2 groups give 2 + 1),
so a header of shapes goes first (one all_gather of MAX_HEADER int64 on a host group: shapes are host data,
so nothing waits for the GPU), then each tensor leaf padded to the largest of its sizes (one all_gather per
leaf on the device group; one leaf for a diffusers transformer):

    rank 0: sample [2, 64, 16]  |  rank 1: sample [1, 64, 16]
    header -> sizes 2048 and 1024 -> both send 2048 values -> rank r keeps the first numel_r of part r

`agree_min(flags, groups)`: the elementwise minimum of small integer flags over every rank of the mesh (on
its host groups, `host.py`), so that all ranks take the same branch (a rank that skipped a forward its peers run
would hang them).
"""

from __future__ import annotations

import torch

from ...errors import ForwardError
from ...styles.collectives import all_gather_along
from . import host
from .tree import leaves, rebuild

MAX_HEADER = 64  # int64 values: 1 + sum over leaves of (1 + ndim); a transformer output needs ~5


def gather_parts(output, group, host_group=None, host_device: str = "cpu") -> list:
    """`output` of every rank of `group`, in group rank order (this rank's own tree included); the shapes go
    through `host_group` (the same ranks on a CPU group, tensors on `host_device`; None: `group` itself)."""
    local = leaves(output)
    if host_group is None:
        host_group, host_device = group, str(local[0].device) if local else "cpu"
    shapes = _gather_shapes(local, host_group, host_device)
    parts: list[list[torch.Tensor]] = [[] for _ in shapes]
    for i, tensor in enumerate(local):
        sizes = [torch.Size(rank_shapes[i]) for rank_shapes in shapes]
        for part, received in zip(parts, _gather_leaf(tensor, sizes, group)):
            part.append(received)
    return [rebuild(output, part) for part in parts]


def _gather_shapes(local: list[torch.Tensor], group, device: str = "cpu") -> list[list[tuple[int, ...]]]:
    header = [len(local)]
    for tensor in local:
        header += [tensor.ndim, *tensor.shape]
    if len(header) > MAX_HEADER:
        raise ForwardError(f"cfg exchange: the transformer's output has {len(local)} tensors; at most ~12 supported.")
    return [_parse_header(h, len(local)) for h in host.gather_ints(header, MAX_HEADER, group, device)]


def _parse_header(header: list[int], expected: int) -> list[tuple[int, ...]]:
    if header[0] != expected:
        raise ForwardError(
            f"cfg exchange: cfg groups returned different outputs ({header[0]} vs {expected} tensors); every "
            "group must run the same transformer."
        )
    shapes, at = [], 1
    for _ in range(expected):
        ndim = header[at]
        shapes.append(tuple(header[at + 1 : at + 1 + ndim]))
        at += 1 + ndim
    return shapes


def _gather_leaf(tensor: torch.Tensor, sizes: list[torch.Size], group) -> list[torch.Tensor]:
    """One tensor leaf from every rank: padded to the largest numel for the all_gather, then cut back."""
    longest = max(size.numel() for size in sizes)
    flat = tensor.contiguous().reshape(-1)
    if flat.numel() < longest:
        flat = torch.cat([flat, flat.new_zeros(longest - flat.numel())])
    # One buffer and the ProcessGroup's own all-gather (`styles.collectives`: `dist.all_gather`'s Python checks
    # and one buffer per rank cost more host time than the exchange itself); each rank's part a view of it.
    gathered = all_gather_along(flat, group, 0)
    return [gathered[at * longest : at * longest + size.numel()].view(size) for at, size in enumerate(sizes)]


def agree_min(flags: list[int], groups, device: str = "cpu") -> list[int]:
    """The minimum of each flag over every rank of `groups` (host groups spanning the mesh; all ranks get the
    same list)."""
    return host.min_ints(flags, groups, device)
