"""torchao's known-harmless start-up lines, filtered from the logs of a run that never asked for quantization.

transformers imports torchao whenever it is installed (`transformers.modeling_utils` -> its torchao quantizer), so
every `dtp run` / `dtp demo` process imports it. On a machine without CUDA, torchao 0.18 then logs

    Failed to load .../torchao/_C_mxfp8...so: Could not load this library: ...
    Failed to load .../torchao/_C_cutlass_90a.abi3.so: Could not load this library: ...

(its CUDA kernels; DESIGN.md: harmless on CPU) and torch logs a deprecation for each Enum torchao registers as a
pytree constant (`<enum 'KernelPreference'> is an Enum subclass ... register_constant() ... deprecated`). The
filters drop exactly those records: a CUDA kernel library that fails to load on a machine with CUDA, any other
torchao message and any other pytree warning still print.
"""

from __future__ import annotations

import logging
import re
import sys

TORCHAO_LOGGER = "torchao"
PYTREE_LOGGER = "torch.utils._pytree"
CUDA_KERNEL_LIBRARY = re.compile(r"^Failed to load \S*torchao/_C_(mxfp8|cutlass_\w+)\S*\.so: Could not load this")
ENUM_CONSTANT = "is an Enum subclass and is now natively supported by torch.compile"


def _no_cuda() -> bool:
    torch = sys.modules.get("torch")  # torchao imports torch before it logs; never imported here
    return torch is not None and not torch.cuda.is_available()


def _torchao_record(record: logging.LogRecord) -> bool:
    """False (drop) for a torchao CUDA kernel library that cannot load on a machine without CUDA."""
    return not (CUDA_KERNEL_LIBRARY.match(record.getMessage()) and _no_cuda())


def _pytree_record(record: logging.LogRecord) -> bool:
    """False (drop) for torch's deprecation of an Enum that torchao registers as a pytree constant."""
    if ENUM_CONSTANT not in str(record.msg) or not record.args:
        return True
    enum = record.args[0] if isinstance(record.args, tuple) else None
    return not (isinstance(enum, type) and enum.__module__.startswith("torchao"))


def quiet_torchao() -> None:
    """Install both filters (idempotent). Call it before transformers or torchao is imported: the CLI does."""
    for name, check in ((TORCHAO_LOGGER, _torchao_record), (PYTREE_LOGGER, _pytree_record)):
        logger = logging.getLogger(name)
        if check not in logger.filters:
            logger.addFilter(check)
