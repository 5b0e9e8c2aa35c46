"""How a LoRA adapter is split over the `tp` ranks: like its base Linear, on the side the base splits.

peft computes `y = base(x) + B(A(x)) * s` (A is [r, in], B is [out, r]). On a sharded base that
sum stays exact when the adapter factor that touches the base's split dim is split the same way,
with the base's own style, and the other factor is whole (r is tiny):

    colwise / packed_colwise   y_r = x W_r^T + (x A^T) B_r^T s        B split like W's rows (per block),
                                                                      A whole; no collective
    rowwise / packed_rowwise   y   = sum_r x_r W_r^T + (sum_r x_r A_r^T) B^T s
                                                                      A split like W's columns (per block);
                                                                      its [tokens, r] output all-reduced
                                                                      (Rowwise style), B whole
    colwise_gathered           y   = gather_r(x W_r^T) + gather_r((x A^T) B_r^T) s
                                                                      B split like W's rows, its output
                                                                      all-gathered (GatheredColwise), A whole

For colwise_gathered, keeping A and B whole would spare the all-gather; splitting B keeps every
rank's adapter bytes at 1/tp and costs one all-gather as large as the base's own output, which
for the layers this style is made for (AdaLN modulation: [batch, k * dim]) is a few kilobytes.
Replicated (unplanned) bases keep peft's plain adapter untouched.

The split factor uses the base's `LinearSpec` (so its `Layout`, the one home of the slicing math)
and its ParallelStyle; the whole factor is a `Replicate` DTensor whose forward runs on its local tensor (no
collective), like every sharded Linear's (`styles/parallel.py`).
Both are DTensors so that peft's merge (`W.data += B @ A * s`, used by `fuse_lora`) meets DTensors
with matching placements: `Shard(0) @ Replicate -> Shard(0)` on a colwise W, `Replicate @ Shard(1)
-> Shard(1)` on a rowwise one; the product is row- (column-) local, so packed blocks line up too.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from ..engine import SPEC_ATTR
from ..resolve.binding.linears import LinearSpec
from ..styles import LinearStyle, local_parameter

PARTS = ("lora_A", "lora_B")


def planned_spec(linear: nn.Module | None) -> LinearSpec | None:
    """The LinearSpec dtp sharded `linear` with, or None for a replicated (unplanned) layer."""
    return getattr(linear, SPEC_ATTR, None)


def split_part(spec: LinearSpec) -> str:
    """The adapter factor that meets the base's split dim: B for colwise kinds, A for rowwise kinds."""
    return spec.style.lora_split


def part_spec(spec: LinearSpec, part: str, adapter_name: str, has_bias: bool) -> LinearSpec:
    """The split factor as a Linear of its own: the base's rule and blocks (B's rows are W's rows, A's
    columns are W's columns)."""
    return LinearSpec(f"{spec.path}.{part}.{adapter_name}", spec.rule, spec.sizes, has_bias)


def local_tensor(spec: LinearSpec, part: str, param: str, tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s piece of one LoRA tensor of a sharded base, as peft sizes it (from the local weight).

    Example: a colwise base 64 -> 64 at tp=2 with rank 4: B [64, 4] -> rows 32*rank : 32*(rank+1); A stays [4, 64].
    """
    if part != split_part(spec):
        return tensor
    layout = part_spec(spec, part, "", has_bias=param == "bias").param_layouts()[param]
    return tensor if layout is None else layout.local_slice(tensor, tp, rank)


class Whole(LinearStyle):
    """A Linear every rank holds whole, as `Replicate` DTensors: local in, local out, no collective."""

    output_placement = Replicate()

    def __init__(self):
        ParallelStyle.__init__(self)
        self.layouts, self.device, self.weights_local = {}, None, True


def place_adapter(layer: nn.Module, adapter_name: str, spec: LinearSpec, mesh) -> None:
    """Turn the local tensors peft loaded for `adapter_name` on `layer` into DTensors with the styles' forward."""
    split = split_part(spec)
    for part in PARTS:
        linear = getattr(layer, part)[adapter_name]
        if part == split:
            piece = part_spec(spec, part, adapter_name, linear.bias is not None)
            _wrap_local(linear, piece.param_layouts(), mesh)
            parallelize_module(linear, mesh, spec.style.parallel_style(piece, weights_local=True))
        else:
            _wrap_local(linear, {name: None for name, _ in linear.named_parameters(recurse=False)}, mesh)
            parallelize_module(linear, mesh, Whole())


def _wrap_local(linear: nn.Linear, layouts: dict, mesh) -> None:
    for name, param in list(linear.named_parameters(recurse=False)):
        linear.register_parameter(name, local_parameter(param.data, layouts[name], mesh, param.requires_grad))
