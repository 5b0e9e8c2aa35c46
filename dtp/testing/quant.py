"""Quantize a test model the way torchao would, on CPU and in fp32 (test fixture; needs torchao).

`quantize(model, scheme)` with scheme in SCHEMES: int8wo / fp8wo call torchao's `quantize_` as a
user does; layerwise is diffusers' `enable_layerwise_casting` (float8 storage, fp32 compute).
fp8 (float8 dynamic activation, per-row weight and per-token activation scales; fp8t: both per tensor,
torchao's default granularity) is built with the
same `Float8Tensor.from_hp` call torchao's transform makes, because `quantize_` refuses it on a CPU
(it asserts a CUDA capability >= 8.9) and on fp32 weights (it asserts bf16 for per-row), and the
parity tests run fp32 on CPU. A Linear torchao's transform would skip (a dim not a multiple of 16)
is skipped the same way.
"""

from __future__ import annotations

import torch
from torch import nn

SCHEMES = ("int8wo", "fp8wo", "fp8", "fp8t", "layerwise")


def quantize(model: nn.Module, scheme: str, filter_fn=None, sharded: bool = False) -> nn.Module:
    """Quantize every Linear of `model` (or those `filter_fn(module, fqn)` accepts) with `scheme`, in place.

    sharded=True: through `dtp.quantize` (torchao's `quantize_` plus padded rows and layouts kept), for a
    model `dtp.parallelize` sharded; else torchao's `quantize_` itself.
    """
    from torchao.quantization import quantize_

    from ..quant import LAYOUT_ATTR, config_for, keep_layout
    from ..quant import quantize as dtp_quantize

    apply = dtp_quantize if sharded else quantize_
    if scheme in ("int8wo", "fp8wo"):
        apply(model, config_for(scheme), filter_fn=filter_fn)
    elif scheme in ("fp8", "fp8t"):
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and (filter_fn is None or filter_fn(module, name)):
                layout = getattr(module.weight, LAYOUT_ATTR, None)
                _fp8_dynamic(module, per_tensor=scheme == "fp8t")
                if sharded and layout is not None:
                    keep_layout(module, "weight", layout)
    elif scheme == "layerwise":  # diffusers' layerwise casting: float8 storage, fp32 compute (plain tensors)
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    else:
        raise ValueError(f"unknown scheme {scheme!r}; one of {SCHEMES}")
    return model


def _fp8_dynamic(linear: nn.Linear, per_tensor: bool = False) -> None:
    """torchao's Float8DynamicActivationFloat8WeightConfig(granularity=PerRow() or PerTensor()) transform, minus
    its checks."""
    from torchao.float8.inference import Float8MMConfig
    from torchao.quantization import PerRow, PerTensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import (
        Float8Tensor,
        QuantizeTensorToFloat8Kwargs,
    )

    out_features, in_features = linear.weight.shape
    if out_features % 16 or in_features % 16:  # torchao's `_fp8_mm_compat` leaves these unquantized
        return
    granularity = PerTensor() if per_tensor else PerRow()
    weight = Float8Tensor.from_hp(
        linear.weight.detach(),
        granularity=granularity,
        mm_config=Float8MMConfig(use_fast_accum=True),
        act_quant_kwargs=QuantizeTensorToFloat8Kwargs(granularity=granularity),
    )
    linear.weight = nn.Parameter(weight, requires_grad=False)
