"""Fake CUDA tensors on a CPU-only torch: FakeTensorMode makes `device="cuda"` tensors and torch's CUDA ops run on
them, but three Python paths raise "PyTorch is not linked with support for cuda devices": `Tensor.__getitem__`,
`~` (`__invert__`) and `Tensor.contiguous`. `AtenIndexing` routes them through their aten forms (`select` /
`slice` / `unsqueeze` / `index`, `bitwise_not`, `clone(memory_format=contiguous_format)`), so a diffusers
model's forward runs on fake CUDA; dtp's own CP code needs no routing (it is written in those forms). Values are
never computed: only ops, shapes and dtypes.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def fake_cuda_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised fake CUDA tensor of `t`'s shape (call inside a FakeTensorMode); floating tensors in `dtype`."""
    target = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return torch.empty(t.shape, dtype=target, device="cuda")


class AtenIndexing(TorchFunctionMode):
    """While active, `x[index]`, `~x` and `x.contiguous()` on any tensor run through aten ops (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__:
            return basic_index(*args)
        if func is torch.Tensor.__invert__:
            return torch.bitwise_not(args[0])
        if func is torch.Tensor.contiguous:
            x = args[0]
            return x if x.is_contiguous() else x.clone(memory_format=torch.contiguous_format)
        return func(*args, **kwargs)


def basic_index(x: torch.Tensor, index) -> torch.Tensor:
    """`x[index]` for ints, slices, None, Ellipsis and one tensor index, as aten ops."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(i is Ellipsis for i in items):
        at = next(n for n, i in enumerate(items) if i is Ellipsis)
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.ndim - used)
    dim = 0
    for item in items:
        if item is None:
            x = x.unsqueeze(dim)
            dim += 1
        elif isinstance(item, bool) or isinstance(item, torch.Tensor) and item.dtype == torch.bool and item.ndim == 0:
            raise NotImplementedError("AtenIndexing: bool scalar indices")
        elif isinstance(item, int):
            x = x.select(dim, item)
        elif isinstance(item, slice):
            start, stop, step = item.indices(x.shape[dim])
            x = torch.ops.aten.slice(x, dim, start, stop, step)
            dim += 1
        elif isinstance(item, torch.Tensor):
            x = torch.ops.aten.index(x, [None] * dim + [item])
            dim += item.ndim
        else:
            raise NotImplementedError(f"AtenIndexing: index {item!r}")
    return x
