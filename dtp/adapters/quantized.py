"""LoRA on a sharded quantized base (torchao Int8Tensor / Float8Tensor holding DTensor pieces).

peft (>= 0.21) wraps a torchao-quantized Linear in `TorchaoLoraLinear`: `y = base(x) + B(A(x)) * s`, the
base running its own quantized matmul, the adapter in the compute dtype; on one process that is what
diffusers + peft do with a model loaded with `TorchAoConfig`. Under dtp the base's weight is the torchao
class around DTensors, so the adapter splits exactly as on an unquantized base (`shard.py`); two things
differ: the weight is not itself a DTensor, so the mesh and the local shape are its `qdata`'s, and peft
sizes such a layer from the Linear's `in_features` / `out_features` (its DTensor rule does not see
inside the subclass): `local_features` sets them to the local shape while peft builds the layer.
Merging (`fuse_lora` / `unfuse_lora`) is peft's: dequantize, add (subtract) `B A s`, quantize again with the
model's torchao config (peft takes it from diffusers' `hf_quantizer`; a model dtp loaded has none, so
`requantize_on_merge` gives the layer the config of its weight's scheme). Quantized again on the DTensor
weight, a row's scale is the whole row's (as in `dtp.quantize`); `keep_layout` then repairs padded rows and
records the layout again.
"""

from __future__ import annotations

import contextlib

from torch import nn

from ..errors import PlanError
from ..quant import config_for, describe, is_quantized, keep_layout

MERGE_KEPT = "_dtp_merge_kept"  # on a TorchaoLoraLinear whose merge / unmerge `requantize_on_merge` wrapped


def sharded_data(linear: nn.Module):
    """The DTensor that carries `linear`'s sharding: its weight, or a quantized weight's `qdata`."""
    weight = linear.weight
    return weight.qdata if is_quantized(weight) else weight


@contextlib.contextmanager
def local_features(linears):
    """While peft builds its layers: each sharded quantized Linear of `linears` reports its local
    (out, in) shape as `out_features` / `in_features`, as peft reads a DTensor weight's; restored after."""
    saved = {}
    for linear in linears:
        if is_quantized(linear.weight):
            saved[linear] = (linear.in_features, linear.out_features)
            linear.out_features, linear.in_features = sharded_data(linear).to_local().shape
    try:
        yield
    finally:
        for linear, (in_features, out_features) in saved.items():
            linear.in_features, linear.out_features = in_features, out_features


def requantize_on_merge(layer: nn.Module, layout) -> None:
    """Let peft's TorchaoLoraLinear `layer` merge on a quantized base: the torchao config of its weight's scheme
    when peft found none (diffusers' `hf_quantizer`), and a sharded base's `layout` kept after each (un)merge.
    A weight whose scheme has no config of its own here (per-tensor scales): merging is a PlanError before
    anything changes."""
    if getattr(layer, MERGE_KEPT, False):  # a second adapter on the same layer
        return
    setattr(layer, MERGE_KEPT, True)
    base = layer.get_base_layer()
    if layer.get_apply_tensor_subclass is None:
        kind = describe(base.weight)
        layer.get_apply_tensor_subclass = lambda: _scheme_config(kind, base)
    for name in ("merge", "unmerge"):
        method = getattr(layer, name)

        def kept(*args, method=method, **kwargs):
            layer.get_apply_tensor_subclass()  # a PlanError here leaves the layer as it was
            method(*args, **kwargs)
            keep_layout(base, "weight", layout)

        setattr(layer, name, kept)


def _scheme_config(kind, base):
    """The torchao config that quantizes a merged weight as `kind` was (per-row scales)."""
    if kind.granularity != "per_row":
        raise PlanError(
            f"fuse_lora on a sharded {kind.scheme} layer with {kind.granularity} scales ({type(base).__name__}): dtp "
            f"re-quantizes merged weights with per-row scales only; keep the LoRA unfused (set_adapters), or fuse "
            f"it into the unquantized model before quantizing."
        )
    return config_for(kind.scheme)
