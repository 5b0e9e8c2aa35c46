"""Slice a torchao-quantized weight with the styles' `Layout` math and rebuild it around DTensors.

The sharded weight is the same torchao subclass, holding this rank's pieces as DTensors:

    qdata  Layout.local_slice(qdata)                  as Shard(layout.dim)   (block order, zero padding)
    scale  colwise (dim 0): the same rows' scales     as Shard(0), a padded row's scale is 1 (its qdata is 0)
           rowwise (dim 1): the whole row's scale     as Replicate()         (never recomputed from a slice)
           per tensor: the one scale                  as Replicate()

which is what torchao's own `quantize_` builds on a weight that is already a DTensor (the order
`dtp.parallelize` then `quantize_`): the subclass's linear then runs on DTensors, so the styles'
input/output hooks, the rowwise all-reduce and a rowwise bias added once after it are unchanged.
Worked example: int8, per row, W [64, 32] colwise at tp = 2: rank 1 holds qdata[32:64] and scale[32:64];
rowwise at tp = 2: rank 1 holds qdata[:, 16:32] and all 64 scales.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor, Replicate, Shard

from .dynamic import install_dynamic_rowwise
from .kinds import LAYOUT_ATTR, describe


def shard_weight(weight, layout, mesh, device=None):
    """This rank's piece of the torchao-quantized `weight` (Int8Tensor / Float8Tensor), split as `layout` says.

    Returns the same subclass around DTensor `qdata` / `scale` (see the module docstring); only this
    rank's data is copied (and moved to `device` when given). `prepare` refused every weight
    `describe` marks unsupported, so here it is one of the supported kinds.
    """
    kind = describe(weight)
    assert kind is not None and kind.supported, kind
    zero_point = getattr(weight, "zero_point", None)
    qdata, scale, zero_point = shard_pieces(weight.qdata, weight.scale, zero_point, layout, mesh, device)
    block_size = sharded_block_size(weight.block_size, weight.qdata.shape, qdata.shape)
    return rebuild(weight, qdata, scale, block_size, zero_point)


def shard_pieces(qdata, scale, zero_point, layout, mesh, device=None) -> tuple[DTensor, DTensor, DTensor | None]:
    """This rank's (qdata, scale, zero_point) DTensors of a per-row or per-tensor quantized weight split as
    `layout` says (the module docstring's table). Each piece is a tensor, or a safetensors slice
    (`get_slice`: a checkpoint saved already quantized, `dtp/loading/prequantized.py`): the same math
    either way, and only this rank's rows (or, for rowwise, its columns and the whole scales) are read."""
    tp, rank = mesh.size(), mesh.get_local_rank()
    local = _to(layout.local_slice(qdata, tp, rank), device)
    qdata = DTensor.from_local(local, mesh, [Shard(layout.dim)], run_check=False)
    scale = _shard_rows(scale, layout, tp, rank, device, mesh, fill=1.0)
    if zero_point is not None:
        zero_point = _shard_rows(zero_point, layout, tp, rank, device, mesh, fill=0)
    return qdata, scale, zero_point


def _shard_rows(values, layout, tp: int, rank: int, device, mesh, fill) -> DTensor:
    """Per-row values (scales, zero points) of a weight split by `layout`: sliced with the rows when the
    rows split (padded rows get `fill`), whole on every rank when the columns split or there is one value.
    `values` is a tensor or a safetensors slice."""
    shape = list(values.shape) if isinstance(values, torch.Tensor) else list(values.get_shape())
    if layout.dim != 0 or math.prod(shape) == 1:
        whole = values.clone() if isinstance(values, torch.Tensor) else values[:]
        return DTensor.from_local(_to(whole, device), mesh, [Replicate()], run_check=False)
    local = layout.local_slice(values, tp, rank)
    if layout.is_padded:
        real = layout.local_slice(torch.ones(shape[0], dtype=torch.bool), tp, rank)
        local[~real] = fill
    return DTensor.from_local(_to(local, device), mesh, [Shard(0)], run_check=False)


def sharded_block_size(block_size, shape, global_shape) -> list[int]:
    """The block size of the sharded tensor: a dim quantized whole (per row: the columns; per tensor: all)
    stays whole at its global (padded) size. `shape`: the unsharded data's; `global_shape`: the sharded one's."""
    return [global_shape[i] if block_size[i] == shape[i] else block_size[i] for i in range(len(shape))]


def _to(tensor: torch.Tensor, device) -> torch.Tensor:
    return tensor if device is None else tensor.to(device)


def rebuild(weight, qdata, scale, block_size, zero_point=None):
    """A new tensor of `weight`'s subclass with other data and scales, every other attribute kept."""
    if type(weight).__name__ == "Int8Tensor":
        return type(weight)(
            qdata,
            scale,
            block_size,
            weight.dtype,
            zero_point=zero_point,
            act_quant_kwargs=weight.act_quant_kwargs,
            reduce_range=weight.reduce_range,
        )
    return type(weight)(
        qdata,
        scale,
        block_size=block_size,
        mm_config=weight.mm_config,
        act_quant_kwargs=weight.act_quant_kwargs,
        kernel_preference=weight.kernel_preference,
        dtype=weight.dtype,
    )


def sharded_parameter(weight, layout) -> torch.nn.Parameter:
    """A frozen Parameter around a sharded quantized weight, its layout recorded like the styles' parameters."""
    param = torch.nn.Parameter(weight, requires_grad=False)
    setattr(param, LAYOUT_ATTR, layout)
    return param


def distribute_quantized(module: torch.nn.Module, mesh, partition_fn, input_fn, output_fn) -> torch.nn.Module:
    """`distribute_module` for a Linear whose weight is a torchao subclass: the same partition and hooks,
    without torch's last step (replicating every parameter that is not a DTensor instance by a broadcast,
    which the subclass does not implement; its DTensors are inside it)."""
    partition_fn("", module, mesh)
    install_dynamic_rowwise(module)
    module.register_forward_pre_hook(lambda _, inputs: input_fn(module, inputs, mesh))
    module.register_forward_hook(lambda _, inputs, output: output_fn(module, output, mesh))
    return module


def full_weight(weight, layout):
    """The unsharded quantized weight (same subclass, plain tensors) from every rank's piece; collective.

    The inverse of `shard_weight`: `qdata` reassembled by `layout` (padding dropped), row-split scales
    likewise, replicated ones taken as they are. Equal to the weight before sharding, bit for bit.
    """
    qdata = layout.assemble(_gather_locals(weight.qdata))
    scale = _full_rows(weight.scale, layout)
    zero_point = getattr(weight, "zero_point", None)
    zero_point = None if zero_point is None else _full_rows(zero_point, layout)
    block_size = sharded_block_size(weight.block_size, weight.qdata.shape, qdata.shape)
    return rebuild(weight, qdata, scale, block_size, zero_point)


def _full_rows(values: DTensor, layout) -> torch.Tensor:
    if isinstance(values.placements[0], Replicate):
        return values.to_local()
    return replace(layout, dim=0).assemble(_gather_locals(values))


def _gather_locals(tensor: DTensor) -> list[torch.Tensor]:
    """Every rank's local piece of `tensor`, in rank order. One-byte dtypes travel as uint8 (gloo has no float8)."""
    local = tensor.to_local().contiguous()
    raw = local.view(torch.uint8) if local.element_size() == 1 else local
    gathered = funcol.all_gather_tensor(raw, gather_dim=0, group=tensor.device_mesh.get_group())
    return [piece.view(local.dtype) for piece in torch.chunk(gathered, tensor.device_mesh.size(), dim=0)]
