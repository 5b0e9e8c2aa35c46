"""Shard-on-load with quantization: each rank quantizes its own slice of every Linear weight as it is read.

`from_pretrained(..., quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))` (or a torchao
config itself): a Linear weight's slice is read, cast, wrapped as this rank's DTensor, then quantized
by torchao on that DTensor, so a rowwise row's scale comes from an all-reduced amax (the whole row)
and a colwise row is whole on its rank; padded rows are repaired (`after.py`). Held at any time: the
quantized share read so far plus one high-precision slice. Which Linears are quantized follows
diffusers' TorchAo quantizer: every `nn.Linear` weight except `modules_to_not_convert` and the
model's `_keep_in_fp32_modules`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

import torch
from torch import nn

from ..errors import PlanError
from .after import quantize_linear
from .kinds import GGUF_PROBLEM, describe

LOADABLE = ("Int8WeightOnlyConfig", "Float8WeightOnlyConfig", "Float8DynamicActivationFloat8WeightConfig")
FP8_DYNAMIC = "Float8DynamicActivationFloat8WeightConfig"


class LoadQuantizer:
    """Quantizes, during loading, the Linear weights `quantization_config` selects."""

    def __init__(self, model: nn.Module, quantization_config):
        self.config, skip = torchao_config(quantization_config)
        check_not_prequantized(model)
        check_runnable(self.config, getattr(model, "dtype", None))
        self.trim = HeapTrimmer()
        self.skip = [*skip, *(getattr(model, "_keep_in_fp32_modules", None) or [])]

    def wants(self, model: nn.Module, key: str) -> bool:
        module_path, _, name = key.rpartition(".")
        if name != "weight" or any(s + "." in key or s == module_path for s in self.skip):
            return False
        return isinstance(model.get_submodule(module_path), nn.Linear)

    def __call__(self, model: nn.Module, key: str, layout) -> None:
        """Quantize the just-installed weight `key` (its slice when `layout` is given), if selected; the
        high-precision slice is then freed and its pages handed back (`trim_heap`)."""
        if self.wants(model, key):
            quantize_linear(model.get_submodule(key.rpartition(".")[0]), self.config, layout)
            self.trim()


TRIM_STEP_BYTES = 32 << 20  # trim when the resident set grew this much since the last trim


class HeapTrimmer:
    """Calls `trim_heap` when this process's resident memory grew by more than `step` bytes since the last trim:
    the share being loaded grows it too, so a 149 MB share costs a handful of trims, not one per tensor."""

    def __init__(self, step: int = TRIM_STEP_BYTES):
        self.step = step
        self.mark = resident_bytes()

    def __call__(self) -> None:
        if resident_bytes() - self.mark > self.step:
            trim_heap()
            self.mark = resident_bytes()


def resident_bytes() -> int:
    """This process's resident set size from /proc/self/statm (0 where there is none: nothing is trimmed)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library, or no libc found)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc `malloc_trim(0)`; elsewhere nothing).

    Why: a slice of a large weight is read (fp32 or bf16), quantized (int8 / float8, 1/4 or 1/2 its size) and
    freed. glibc serves such mid-size blocks from its heap once its dynamic mmap threshold has risen (up to
    32 MB), and keeps freed heap memory for reuse; the next slices differ in size, so the kept memory grows
    (+491 MB peak for a 149 MB quantized share at tp=2 in benchmarks/quant_load_memory.py, +237 MB with a trim
    after every weight at ~15 ms of CPU each; `HeapTrimmer` trims only when the resident set grew).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def check_not_prequantized(model: nn.Module) -> None:
    """PlanError when the skeleton's weights are quantized already (a checkpoint saved quantized by torchao,
    `dtp/loading/prequantized.py`): a second quantization_config would quantize them again."""
    kinds = {name: describe(param) for name, param in model.named_parameters()}
    saved = next(((name, kind) for name, kind in kinds.items() if kind is not None), None)
    if saved is not None:
        name, kind = saved
        raise PlanError(
            f"quantization_config was given, but the checkpoint was saved already quantized ('{name}': torchao "
            f"{kind.cls}, scheme {kind.scheme}); drop quantization_config to load it as saved, or load the "
            f"unquantized checkpoint to quantize it with another scheme."
        )


def torchao_config(quantization_config) -> tuple[object, list[str]]:
    """(torchao config, modules not to convert) from diffusers' TorchAoConfig or a torchao config; PlanError
    for anything dtp cannot quantize slice by slice exactly (checked before a byte is read)."""
    config = getattr(quantization_config, "quant_type", quantization_config)
    skip = list(getattr(quantization_config, "modules_to_not_convert", None) or [])
    name = type(config).__name__
    if name == "GGUFQuantizationConfig":
        raise PlanError(
            "quantization_config GGUFQuantizationConfig: GGUF weights come from a .gguf single file (diffusers' "
            f"from_single_file), not from a safetensors folder dtp reads slice by slice, and {GGUF_PROBLEM}."
        )
    granularity = _granularity_names(config)
    if name not in LOADABLE or not set(granularity.split(", ")) <= {"PerRow", "PerTensor"}:
        raise PlanError(
            f"quantization_config {name} (granularity {granularity}) is not one dtp can apply while loading "
            f"slices: use TorchAoConfig({' or '.join(c + '()' for c in LOADABLE)}) with PerRow or PerTensor "
            f"granularity, or load unquantized and call dtp.quantize(model, config) (colwise-only schemes)."
        )
    return config, skip


def _granularity_names(config) -> str:
    """ "PerRow", or "PerRow, PerRow" for a float8 dynamic config's [activation, weight] granularities."""
    granularity = getattr(config, "granularity", None)
    values = granularity if isinstance(granularity, (list, tuple)) else [granularity]
    return ", ".join(type(value).__name__ for value in values)


def check_runnable(config, dtype) -> None:
    """PlanError, before a byte is read, where torchao itself would stop mid-load with a bare AssertionError:
    float8 dynamic activation needs a CUDA GPU of capability >= 8.9 (torchao's float8 matmul), and with PerRow
    scales bfloat16 weights (`torch_dtype=torch.bfloat16`)."""
    if type(config).__name__ != FP8_DYNAMIC:
        return
    from torchao.float8.inference import _check_hardware_support

    try:
        _check_hardware_support(config.granularity)
    except AssertionError as error:
        raise PlanError(
            f"quantization_config {FP8_DYNAMIC} needs a CUDA GPU of compute capability >= 8.9 (or an XPU) for "
            f"torchao's float8 matmul ({error or 'torchao refused this machine'}); use Float8WeightOnlyConfig or "
            f"Int8WeightOnlyConfig here."
        ) from None
    if "PerRow" in _granularity_names(config) and dtype is not None and dtype != torch.bfloat16:
        raise PlanError(
            f"quantization_config {FP8_DYNAMIC} with PerRow scales quantizes bfloat16 weights only (torchao); "
            f"the model loads as {dtype}: pass torch_dtype=torch.bfloat16 (dtp run: --dtype bf16)."
        )


def prequantized_problem(config: dict) -> str | None:
    """Why dtp cannot shard-on-load a checkpoint whose config.json carries `quantization_config` (saved already
    quantized), or None for an unquantized one and for a torchao one (read piece by piece,
    `dtp/loading/prequantized.py`, which refuses the torchao classes it cannot slice). The caller raises it as a
    CheckpointError, before any read."""
    quantization = config.get("quantization_config")
    if not quantization:
        return None
    method = quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else str(quantization)
    if method == "torchao":
        return None
    return (
        f"it was saved already quantized ({method}): dtp reads checkpoints saved quantized by torchao "
        "(Int8Tensor / Float8Tensor weights) only. Load the unquantized (bf16) checkpoint with "
        "quantization_config=TorchAoConfig(...) (each rank quantizes its own slices, bit for bit what diffusers "
        "makes), or keep the model whole"
    )


def diffusers_config(quantization_config):
    """diffusers' TorchAoConfig for a torchao config (diffusers' own `from_pretrained` takes only its own
    config classes); a diffusers config as it is. For the one-process pipeline, the reference; float8 dynamic
    activation where torchao cannot run it is a PlanError here too (`check_runnable`)."""
    check_runnable(getattr(quantization_config, "quant_type", quantization_config), None)
    if type(quantization_config).__module__.startswith("diffusers"):
        return quantization_config
    from diffusers import TorchAoConfig

    return TorchAoConfig(quantization_config)
