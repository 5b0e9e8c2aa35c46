"""The CLI's torchao filters (`dtp/quant/noise.py`) drop exactly the known-harmless records."""

import enum
import logging

from dtp.quant import noise

LIBRARY = "/venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"


def _record(name: str, msg: str, args=()) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


class TorchaoEnum(enum.Enum):
    A = 1


class OtherEnum(enum.Enum):
    A = 1


TorchaoEnum.__module__ = "torchao.quantization.quantize_.common.kernel_preference"
PYTREE = "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type."


def test_only_the_known_lines_are_dropped(monkeypatch):
    """On a machine without CUDA a torchao CUDA kernel library's load failure is dropped, any other torchao record and a
    load failure with CUDA present kept; torch's pytree deprecation is dropped for torchao's enums only."""
    monkeypatch.setattr(noise, "_no_cuda", lambda: True)
    failed = _record("torchao", f"Failed to load {LIBRARY}: Could not load this library: {LIBRARY}")
    assert not noise._torchao_record(failed)
    assert noise._torchao_record(_record("torchao", "Skipping import of cpp extensions due to incompatible torch"))
    assert noise._torchao_record(_record("torchao", "Failed to load /x/torchao/_C_other.so: Could not load this"))
    assert not noise._pytree_record(_record("torch.utils._pytree", PYTREE, (TorchaoEnum,)))
    assert noise._pytree_record(_record("torch.utils._pytree", PYTREE, (OtherEnum,)))
    monkeypatch.setattr(noise, "_no_cuda", lambda: False)
    assert noise._torchao_record(failed)


def test_installed_once_on_the_two_loggers():
    noise.quiet_torchao()
    noise.quiet_torchao()
    assert logging.getLogger("torchao").filters.count(noise._torchao_record) == 1
    assert logging.getLogger("torch.utils._pytree").filters.count(noise._pytree_record) == 1
