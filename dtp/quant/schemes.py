"""Scheme names (as `dtp check --quant` and `dtp run --quant` spell them) -> torchao configs, and byte counts."""

from __future__ import annotations

from torch.distributed.tensor import DTensor

from ..errors import PlanError

SCHEMES = {
    "int8wo": "Int8WeightOnlyConfig",  # int8 weights, per-row scales; activations stay in the compute dtype
    "fp8wo": "Float8WeightOnlyConfig",  # float8 e4m3 weights, per-row scales
    # float8 weights and activations, per-row weight and per-token activation scales (a rowwise layer's token
    # scales from the whole token: quant/dynamic.py); torchao runs it on CUDA GPUs of capability >= 8.9 only
    "fp8": "Float8DynamicActivationFloat8WeightConfig",
}
PER_ROW = ("fp8",)  # schemes whose config is given granularity=PerRow() (torchao's default there is per tensor)


def config_for(scheme: str):
    """The torchao config of a scheme name; PlanError naming the known ones."""
    if scheme not in SCHEMES:
        raise PlanError(f"unknown quantization scheme '{scheme}'; known: {', '.join(SCHEMES)}.")
    import torchao.quantization as tq

    options = {"granularity": tq.PerRow()} if scheme in PER_ROW else {}
    return getattr(tq, SCHEMES[scheme])(**options)


def quantized_bytes(tensor) -> int:
    """Bytes this rank holds for a torchao-quantized tensor: its data, scales and zero points (local pieces)."""
    total = 0
    for name in ("qdata", "scale", "zero_point"):
        inner = getattr(tensor, name, None)
        if inner is not None:
            inner = inner.to_local() if isinstance(inner, DTensor) else inner
            total += inner.numel() * inner.element_size()
    return total
