"""Recognize a quantized weight: which torchao tensor subclass, which scheme, which scale granularity.

torchao (0.18) stores a quantized Linear weight as a tensor subclass with raw data and scales:

    Int8Tensor     qdata int8 [N, K], scale [N, 1] (per row) or [1, 1] (per tensor), zero_point like scale
    Float8Tensor   qdata float8 [N, K], scale [N, 1] (per row) or [1, 1] (per tensor)

and `act_quant_kwargs` set when the activation is quantized on the fly too (the "dynamic activation"
schemes). `W[n, k] = qdata[n, k] * scale[n]` (per row). A per-row scale belongs to one output row, so
it splits with the rows (colwise) and stays whole when the columns split (rowwise) — never recomputed
from a column slice. Anything else (per-group / block scales, static activation scales, AWQ pre-scales,
other subclasses) is refused: dtp cannot show it exact. diffusers' layerwise casting stores plain
float8 tensors (no subclass) and needs nothing here.

torchao is imported only when a weight is one of its subclasses, so `import dtp` stays light.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_CLASSES = ("Int8Tensor", "Float8Tensor")
LAYOUT_ATTR = "_dtp_layout"  # on a sharded parameter: its Layout (the styles set it too; `full_tensor` reads it)


@dataclass(frozen=True)
class QuantKind:
    """What a quantized weight is: torchao class, scheme name (as `dtp check --quant` spells it), granularity."""

    cls: str  # "Int8Tensor", "Float8Tensor", or another torchao class (refused)
    scheme: str  # "int8wo", "int8", "fp8wo", "fp8" (dynamic activation), or the class name when unknown
    granularity: str  # "per_row", "per_tensor", or a description of what was found (refused)
    problem: str | None = None  # why dtp cannot shard it exactly; None when it can

    @property
    def supported(self) -> bool:
        return self.problem is None


def is_quantized(tensor) -> bool:
    """True for a torchao tensor subclass (checked by module name: torchao need not be imported)."""
    return type(tensor).__module__.startswith("torchao") and isinstance(tensor, torch.Tensor)


GGUF_PROBLEM = (
    "dtp does not shard GGUF weights: diffusers' GGUFLinear dequantizes its whole packed byte tensor in every "
    "forward, which dtp's styles do not split (a rowwise split would also need whole quant blocks of 32 or 256 "
    "values per rank); load the bf16 checkpoint with quantization_config=TorchAoConfig(Int8WeightOnlyConfig()) "
    "instead, or keep the model whole"
)


def describe(tensor) -> QuantKind | None:
    """The QuantKind of a torchao-quantized weight (or a GGUF one, refused), None for a plain tensor (fp32/bf16,
    layerwise-cast fp8)."""
    if type(tensor).__name__ == "GGUFParameter":  # diffusers' GGUF loader: raw quant blocks as bytes
        return QuantKind("GGUFParameter", f"gguf {_gguf_type(tensor)}", "blocks", GGUF_PROBLEM)
    if not is_quantized(tensor):
        return None
    cls = type(tensor).__name__
    if cls not in SUPPORTED_CLASSES:
        return QuantKind(
            cls,
            cls,
            "unknown",
            f"torchao's {cls} is not one dtp can slice (supported: Int8Tensor, "
            "Float8Tensor with per-row or per-tensor scales)",
        )
    dynamic = getattr(tensor, "act_quant_kwargs", None) is not None
    scheme = ("int8" if cls == "Int8Tensor" else "fp8") + ("" if dynamic else "wo")
    granularity = _granularity(tensor)
    problem = None
    if granularity not in ("per_row", "per_tensor"):
        problem = f"its scales are {granularity}, not per row or per tensor"
    elif tensor.qdata.ndim != 2:
        problem = f"its data has {tensor.qdata.ndim} dims, not 2"
    elif any(getattr(tensor, name, None) is not None for name in ("act_quant_scale", "act_pre_scale")):
        problem = "it carries static activation scales or pre-scales (SmoothQuant/AWQ), which dtp does not slice"
    elif dynamic and _act_granularity(tensor) not in ("PerRow", "PerToken", "PerTensor"):
        problem = f"its activation granularity is {_act_granularity(tensor)}"
    return QuantKind(cls, scheme, granularity, problem)


def _granularity(tensor) -> str:
    """per_row ([N, 1] scales), per_tensor (one scale), else the scale shape against the data shape."""
    rows, cols = tensor.qdata.shape[0], tensor.qdata.shape[-1]
    shape = tuple(tensor.scale.shape)
    if tensor.scale.numel() == 1:
        return "per_tensor"
    if shape in ((rows, 1), (rows,)):
        return "per_row"
    return f"blocks (scale {list(shape)} for data [{rows}, {cols}])"


def _gguf_type(tensor) -> str:
    """The GGML quant type's name (Q8_0, Q4_K, ...) when the gguf package is there, else its number."""
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(tensor.quant_type).name
    except (ImportError, ValueError):
        return str(tensor.quant_type)


def _act_granularity(tensor) -> str:
    granularity = getattr(tensor.act_quant_kwargs, "granularity", None)
    return type(granularity).__name__
