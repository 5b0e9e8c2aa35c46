"""One home for each policy: what counts as a degree, dtype names, device and backend choice, CP modes.

Every caller (the engine, the loader, the CLI tools, the test launcher) asks here, so a rule is
written once and cannot drift between two copies.
"""

from __future__ import annotations

import importlib.util

import torch

from .choices import ATTENTION_BACKENDS, CP_MODES, DTYPE_NAMES
from .errors import PlanError

# Dtype names accepted anywhere a dtype is spelled out (CLI flags, configs). Short and long forms.
DTYPES = dict(
    zip(
        DTYPE_NAMES,
        (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16, torch.float16, torch.float16),
        strict=True,
    )
)

# The process-group backend for each device type a mesh can live on.
BACKENDS = {"cuda": "nccl", "neuron": "xla", "cpu": "gloo"}


def is_int(value) -> bool:
    """A Python int that is not a bool (`True` is an int to Python, never a count to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_degree(value, what: str) -> int:
    """`value` if it is a positive integer, else PlanError naming `what` (e.g. "tp", "cp", "--nproc")."""
    if not is_int(value) or value < 1:
        raise PlanError(f"{what} must be a positive integer, got {value!r}.")
    return value


def check_cp_mode(mode) -> str:
    """`mode` if it is one of CP_MODES, else PlanError listing them."""
    if mode not in CP_MODES:
        raise PlanError(f"cp_mode must be one of {', '.join(CP_MODES)}, got {mode!r}.")
    return mode


def ulysses_degree(cp: int, cp_mode: str, ulysses: int | None = None) -> int:
    """The Ulysses degree U of a `cp`-rank context-parallel split (USP: ring degree cp / U, Ulysses inside).

    None keeps `cp_mode`'s meaning: "ulysses" is U = cp, "ring" is U = 1. A given U must divide cp; 1 < U < cp is
    USP, whatever `cp_mode` says. cp=8, ulysses=4 -> 4 (ring 2); cp=8, cp_mode="ring" -> 1; cp=8, ulysses=3 ->
    PlanError.
    """
    check_cp_mode(cp_mode)
    if ulysses is None:
        return cp if cp_mode == "ulysses" else 1
    check_degree(ulysses, "ulysses")
    if cp % ulysses:
        divisors = ", ".join(str(d) for d in range(1, cp + 1) if cp % d == 0)
        raise PlanError(
            f"ulysses={ulysses} does not divide cp={cp}; the ring degree is cp / ulysses. Choose one of {divisors}."
        )
    return ulysses


# `attention_backend=` short names -> diffusers' `AttentionBackendName` value (None: the model's default, "native").
_TO_DIFFUSERS = {
    "auto": None,
    "flash": "_native_flash",
    "efficient": "_native_efficient",
    "cudnn": "_native_cudnn",
    "math": "_native_math",
}
# diffusers' name -> the kernel family ring attention runs its blocks in (`runtime/cp/kernels.block_kernel`): the
# backends whose kernel dtp calls with the log-sum-exp. Others run under Ulysses only.
RING_FAMILIES = {
    None: None,
    "native": None,
    "_native_flash": "flash",
    "_native_efficient": "efficient",
    "_native_cudnn": "cudnn",
    "_native_math": "math",
}


def check_attention_backend(name, cp_mode: str | None = None) -> str | None:
    """diffusers' backend name for `attention_backend=name` (None for None / "auto"): PlanError for a name outside
    `choices.ATTENTION_BACKENDS`, for a backend ring attention cannot run (`cp_mode="ring"`: its key blocks need a
    kernel that returns the log-sum-exp) and for one whose package diffusers cannot find."""
    if name is None:
        return None
    if not isinstance(name, str) or name.lower() not in ATTENTION_BACKENDS:
        raise PlanError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)} (or None), got {name!r}.")
    backend = _TO_DIFFUSERS.get(name.lower(), name.lower())
    if cp_mode == "ring" and backend not in RING_FAMILIES:
        raise PlanError(
            f"attention_backend={name!r} cannot run ring attention: ring merges each key block by its log-sum-exp, "
            f"which dtp takes from torch's fused kernels; use attention_backend='cudnn' or 'flash' ('efficient'; "
            f"'math' is the fp32 reference), or cp_mode='ulysses' to keep {name!r}."
        )
    if backend is not None:
        _check_backend_installed(backend, name)
    return backend


def _check_backend_installed(backend: str, name: str) -> None:
    """PlanError when diffusers says `backend`'s package is missing (flash-attn, sageattention, kernels, ...)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    try:
        _check_attention_backend_requirements(AttentionBackendName(backend))
    except (RuntimeError, ImportError) as error:
        raise PlanError(f"attention_backend={name!r}: {error}") from None


def ring_kernel_family(backend: str | None) -> str | None:
    """The ring kernel family of a checked backend (`check_attention_backend`'s value): flash, efficient, cudnn,
    math, or None (auto)."""
    return RING_FAMILIES.get(backend)


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype for a name in DTYPES; PlanError listing the names otherwise."""
    if name not in DTYPES:
        raise PlanError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}.")
    return DTYPES[name]


def check_float_dtype(dtype) -> None:
    """None or a floating torch.dtype (the only casts a checkpoint load makes)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise PlanError(f"torch_dtype must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}.")


def default_device_type() -> str:
    """cuda if a GPU is visible, neuron if torch-neuronx is importable, else cpu."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda"
    if importlib.util.find_spec("torch_neuronx") is not None:
        return "neuron"
    return "cpu"


def default_backend(device_type: str | None = None) -> str:
    """The process-group backend for `device_type` (default: `default_device_type()`)."""
    return BACKENDS.get(device_type or default_device_type(), "gloo")
