"""Refuse, in `prepare` and before anything is mutated, every quantized weight dtp cannot shard exactly."""

from __future__ import annotations

from torch import nn

from ..errors import PlanError
from .kinds import describe

SUPPORTED = (
    "torchao Int8WeightOnlyConfig / Float8WeightOnlyConfig (per-row or per-tensor scales), "
    "Float8DynamicActivationFloat8WeightConfig (per-row), or diffusers' enable_layerwise_casting"
)


def check_quantized(model: nn.Module, linears, plan_name: str) -> None:
    """PlanError for the first planned Linear/Embedding whose weight is quantized in a way dtp cannot shard.

    `linears` are the resolved LinearSpecs. Refused: torchao subclasses other than Int8Tensor /
    Float8Tensor, per-group or block scales, static activation scales, quantized embeddings, and int8
    dynamic activation on a rowwise layer (its per-token activation scales need the whole token's amax;
    dtp all-reduces it for float8 only, `dynamic.py`).
    """
    for spec in linears:
        weight = getattr(model.get_submodule(spec.path), "weight", None)
        kind = describe(weight)
        if kind is None:
            continue
        problem = kind.problem
        if problem is None and spec.style.is_embedding:
            problem = "dtp does not shard quantized embeddings"
        if problem is None and kind.scheme == "int8" and spec.style.shard_dim == 1:
            problem = (
                "a rowwise layer with int8 dynamic activation quantization needs each token's scale from the "
                "whole token (an all-reduce of the amax over tp), which dtp makes for float8 only (quant/dynamic.py)"
            )
        if problem is not None:
            raise PlanError(
                f"plan {plan_name}, key '{spec.rule.key}': '{spec.path}' ({spec.style.value}) holds a quantized "
                f"weight dtp cannot shard exactly: scheme {kind.scheme} (torchao {kind.cls}, {kind.granularity}); "
                f"{problem}. Supported: {SUPPORTED}; or quantize after dtp.parallelize, or keep '{spec.path}' "
                f"unquantized (quantize_'s filter_fn)."
            )


def check_not_quantized(model: nn.Module, paths) -> None:
    """PlanError naming the first of `paths` whose Linear holds a quantized weight. No longer called by
    `dtp.load_lora`, which now loads LoRAs onto sharded quantized layers (`adapters/quantized.py`); kept as
    public API for callers that want the refusal."""
    for path in paths:
        kind = describe(getattr(model.get_submodule(path), "weight", None))
        if kind is not None:
            raise PlanError(
                f"LoRA target '{path}' holds a quantized weight (scheme {kind.scheme}, torchao {kind.cls}); dtp does "
                f"not load LoRAs onto quantized layers. Load the LoRA into the unquantized model, fuse it "
                f"(fuse_lora), then quantize (dtp.quantize), or leave '{path}' unquantized."
            )
