"""Quantize a model that dtp already sharded (`dtp.quantize`), and one Linear at a time while loading.

torchao's `quantize_` already works on DTensor weights: it computes per-row scales with DTensor
reductions, so a rowwise weight's row amax is all-reduced over tp (the whole row's scale) and a colwise
row is whole on its rank. Two things it cannot know are added here:
  - a padded row (pad=True) is all zeros: float8's scale is then amax / 448 = 0 and its data 0 / 0 = NaN,
    which the padded head would spread; dtp sets such rows to data 0, scale 1 (exact zeros again);
  - the parameter's `Layout`, recorded again on the new parameter so `full_tensor` reassembles it.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from ..errors import PlanError
from .dynamic import install_dynamic_rowwise
from .kinds import LAYOUT_ATTR, is_quantized
from .shard import rebuild, sharded_parameter


def quantize(model: torch.nn.Module, config, filter_fn=None) -> torch.nn.Module:
    """torchao `quantize_(model, config, filter_fn)` on a model, sharded by dtp or not; returns it.

    On a sharded model, each sharded Linear's weight is quantized on its DTensor (global row scales),
    padded rows are repaired (see the module docstring) and layouts kept. Equal to sharding the
    one-process model quantized the same way (tests/distributed/test_quant_parity_*.py).
    """
    from torchao.quantization import quantize_

    check_not_fsdp(model)
    layouts = {name: getattr(p, LAYOUT_ATTR) for name, p in model.named_parameters() if hasattr(p, LAYOUT_ATTR)}
    quantize_(model, config, filter_fn=filter_fn)
    for name, layout in layouts.items():
        module_path, _, param_name = name.rpartition(".")
        module = model.get_submodule(module_path)
        keep_layout(module, param_name, layout)
    return model


# What torchao (0.18, with torch 2.13's FSDP2) lacks for fsdp=True, as measured on gloo and held true by
# tests/distributed/test_fsdp_compose.py (which fails once a torchao release implements it).
FSDP_CANNOT = (
    "torchao's quantized weights (Int8Tensor, Float8Tensor) implement neither the ops FSDP2's fully_shard cuts a "
    "weight into padded row shards with (aten.split for Int8Tensor, aten.new_zeros for Float8Tensor) nor FSDP2's "
    "all-gather extension (fsdp_pre_all_gather / fsdp_post_all_gather), and a weight quantized after sharding "
    "replaces FSDP2's DTensor shard with a torchao tensor FSDP2 can no longer gather (no _local_tensor)"
)


def check_not_fsdp(model: torch.nn.Module) -> None:
    """PlanError on a model FSDP2 sharded (`fsdp=True`): torchao cannot quantize FSDP2's shards (`FSDP_CANNOT`)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        raise PlanError(
            f"{type(model).__name__} is sharded with fsdp=True, and {FSDP_CANNOT}. Quantize with fsdp=False (TP "
            f"divides quantized weights), or keep the weights unquantized with fsdp=True."
        )


def quantize_linear(module: torch.nn.Module, config, layout) -> None:
    """Quantize one Linear's weight in place (its slice, a DTensor, when `layout` is given); for the loader."""
    from torchao.quantization import quantize_

    quantize_(module, config, filter_fn=lambda m, fqn: fqn == "")
    if layout is not None:
        keep_layout(module, "weight", layout)


def keep_layout(module: torch.nn.Module, name: str, layout) -> None:
    """After torchao replaced `module.<name>`: repair its padded rows and record its layout again."""
    param = module._parameters[name]
    if not is_quantized(param) or not isinstance(param.qdata, DTensor):
        return
    module._parameters[name] = sharded_parameter(repair_padded_rows(param, layout), layout)
    install_dynamic_rowwise(module)


def repair_padded_rows(weight, layout):
    """A colwise padded weight with every padded row's data 0 and scale 1; other weights as they are."""
    if not layout.is_padded or layout.dim != 0 or weight.scale.numel() == 1:
        return weight
    mesh = weight.qdata.device_mesh
    real = layout.local_slice(torch.ones(sum(layout.block_sizes), dtype=torch.bool), mesh.size(), mesh.get_local_rank())
    qdata, scale = weight.qdata.to_local().clone(), weight.scale.to_local().clone()
    qdata.view(torch.uint8)[~real] = 0  # one-byte data; float8 has no masked_fill (0x00 is +0.0 in both)
    scale[~real] = 1
    qdata = DTensor.from_local(qdata, mesh, weight.qdata.placements, run_check=False)
    scale = DTensor.from_local(scale, mesh, weight.scale.placements, run_check=False)
    return rebuild(weight, qdata, scale, weight.block_size, getattr(weight, "zero_point", None))
