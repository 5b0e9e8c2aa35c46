"""Counts of a mask on fake tensors: taken as every element set, the largest they can be.

A fake tensor has no values, so a forward that sizes a tensor by how many entries of a mask are set cannot run:
FramePack at batch 1 keeps the prompt's tokens up to `encoder_attention_mask.sum(dim=1)[0]` (a slice by an
integer read on the host). `MaskCounts` follows such counts from the reduction of a mask through views and
additions of plain numbers, and answers a host read of one with its upper bound (every element of the mask set, as
`trace.PhaseTrace._all_selected` takes a boolean selection whole): the largest tensor the forward can build, counted
with the guessed branches. A count the forward fills in itself (`torch.full` of a non-negative integer: NucleusMoE's
tokens per expert under expert-choice routing, each expert taking exactly its capacity) is known exactly, and taken
so. A host read of any other integer still raises (token-choice MoE routing counts: no bound known). A mask
is a boolean tensor, or an integer one known to hold 0 / 1: an input named `*mask*` (the prompt's attention mask,
int64 in diffusers' pipelines), ones / zeros, and views and concatenations of masks.

    counts = MaskCounts(masks)                the integer input masks
    counts.record(func, args, kwargs, out)    after each op: a bound for `out` when it is a mask count
    counts.bound(tensor)                      the bound of an integer tensor, or None
"""

from __future__ import annotations

import math
from numbers import Number

import torch
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten

SUMS = {aten.sum.dim_IntList, aten.sum.default, aten.count_nonzero.dim_IntList, aten.count_nonzero.default}
# Ops whose output holds some of the input's values (each at most the input's bound).
SAME = {
    aten.select.int,
    aten.slice.Tensor,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.clone.default,
    aten._to_copy.default,
    aten.alias.default,
    aten.lift_fresh.default,
}
ADDS = {aten.add.Tensor, aten.add.Scalar}
ONES = {aten.ones.default, aten.new_ones.default, aten.zeros.default, aten.new_zeros.default}


class MaskCounts:
    """Upper bounds of the integer tensors that count a mask's set elements (module docstring)."""

    def __init__(self, masks=()):
        self._bounds = WeakIdKeyDictionary()
        self._binary = WeakIdKeyDictionary()  # integer tensors known to hold 0 / 1 only
        for tensor in masks:
            self._binary[tensor] = True

    def binary(self, tensor) -> bool:
        return isinstance(tensor, torch.Tensor) and (tensor.dtype is torch.bool or tensor in self._binary)

    def bound(self, tensor) -> int | None:
        return self._bounds.get(tensor) if isinstance(tensor, torch.Tensor) else None

    def record(self, func, args, kwargs, out) -> None:
        if func is aten.unbind.int and self.bound(args[0]) is not None:  # `for count in counts`, `counts.tolist()`
            for part in out:
                self._bounds[part] = self.bound(args[0])
            return
        if not isinstance(out, torch.Tensor) or not args:
            return
        found = self._bound_of(func, args, kwargs)
        if found is not None:
            self._bounds[out] = found
        if self._makes_mask(func, args):
            self._binary[out] = True

    def _makes_mask(self, func, args) -> bool:
        if func is aten.cat.default:
            return all(self.binary(t) for t in args[0])
        return func in ONES or (func in SAME and self.binary(args[0]))

    def _bound_of(self, func, args, kwargs) -> int | None:
        first = args[0]
        if func is aten.full.default and not out_float(kwargs) and isinstance(args[1], int) and args[1] >= 0:
            return args[1]  # a count set by the forward itself: NucleusMoE's tokens per expert, `torch.full(E, B C)`
        if func in SUMS and self.binary(first):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            if dims is None or (isinstance(dims, (list, tuple)) and not dims):
                return first.numel()
            dims = [dims] if isinstance(dims, int) else dims
            return math.prod(first.shape[d] for d in dims)
        if func in SAME:
            return self.bound(first)
        if func in ADDS and len(args) > 1:
            parts = [self._value(a) for a in args[:2]]
            alpha = kwargs.get("alpha", 1)
            if None not in parts and isinstance(alpha, int) and alpha >= 0:
                return parts[0] + alpha * parts[1]
        return None

    def _value(self, arg) -> int | None:
        """A bounded count's bound, or a plain non-negative integer (a Python one, or a wrapped 0-d constant)."""
        if isinstance(arg, bool) or not isinstance(arg, (Number, torch.Tensor)):
            return None
        if isinstance(arg, Number):
            return int(arg) if isinstance(arg, int) and arg >= 0 else None
        if (known := self.bound(arg)) is not None:
            return known
        constant = getattr(arg, "constant", None)
        if constant is not None and constant.numel() == 1 and not constant.is_floating_point():
            value = int(constant.item())
            return value if value >= 0 else None
        return None


def out_float(kwargs) -> bool:
    """Whether a factory op's output is floating (its `dtype`; None: the default dtype, floating)."""
    dtype = kwargs.get("dtype")
    return dtype is None or dtype.is_floating_point
