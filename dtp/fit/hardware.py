"""Accelerator presets for `dtp fit`'s step-time model, and GPU memory sizes as people write them.

Public datasheet figures, dense (no 2:4 sparsity), per GPU:

    name        memory   bf16 TFLOP/s  fp8 TFLOP/s  fp32 TFLOP/s  memory TB/s  link (as shipped)     GB/s per direction
    H100 SXM    80 GB      989          1979          67          3.35        NVLink 4 (900 GB/s bidir)   450
    H200       141 GB      989          1979          67          4.8         NVLink 4 (900 GB/s bidir)   450
    A100 80GB   80 GB      312           -            19.5        2.039       NVLink 3 (600 GB/s bidir)   300
    L40S        48 GB      362           733          91.6        0.864       PCIe 4.0 x16                 32
    L20         48 GB      119.5         239          59.8        0.864       PCIe 4.0 x16                 32
    RTX 4090    24 GB      165           330          82.6        1.008       PCIe 4.0 x16                 32

(RTX 4090: the fp32-accumulate tensor rate, which is what bf16 matmuls use. fp32: the non-tensor-core FP32 rate,
what an fp32 matmul runs at without TF32, which dtp never enables.) The link figure is what one
GPU can send while it receives as much, the bandwidth a ring collective is limited by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PlanError


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator model, as used by `cost.step_seconds`."""

    name: str
    memory_bytes: int
    """Memory per GPU as sold (the `--gpu-memory` default for this preset)."""
    bf16_flops: float
    """Dense bf16 tensor-core peak, FLOP/s."""
    fp8_flops: float | None
    """Dense fp8 peak, FLOP/s (None: no fp8 tensor cores) - for quantized candidates."""
    fp32_flops: float
    """FP32 peak without tensor cores, FLOP/s: fp32 matmuls (no TF32)."""
    memory_bandwidth: float
    """Bytes/s of device memory."""
    link_bandwidth: float
    """Bytes/s one GPU sends (and receives at once) to its peers: NVLink or PCIe as shipped."""
    link: str
    """"NVLink" or "PCIe"."""


GB = 10**9
GIB = 2**30
T = 10**12

HARDWARE = {
    h.name: h
    for h in (
        Hardware(name="H100 SXM", memory_bytes=80 * GB, bf16_flops=989 * T, fp8_flops=1979 * T, fp32_flops=67 * T,
                 memory_bandwidth=3.35 * T, link_bandwidth=450 * GB, link="NVLink"),
        Hardware(name="H200", memory_bytes=141 * GB, bf16_flops=989 * T, fp8_flops=1979 * T, fp32_flops=67 * T,
                 memory_bandwidth=4.8 * T, link_bandwidth=450 * GB, link="NVLink"),
        Hardware(name="A100 80GB", memory_bytes=80 * GB, bf16_flops=312 * T, fp8_flops=None, fp32_flops=19.5 * T,
                 memory_bandwidth=2.039 * T, link_bandwidth=300 * GB, link="NVLink"),
        Hardware(name="L40S", memory_bytes=48 * GB, bf16_flops=362 * T, fp8_flops=733 * T, fp32_flops=91.6 * T,
                 memory_bandwidth=0.864 * T, link_bandwidth=32 * GB, link="PCIe"),
        Hardware(name="L20", memory_bytes=48 * GB, bf16_flops=119.5 * T, fp8_flops=239 * T, fp32_flops=59.8 * T,
                 memory_bandwidth=0.864 * T, link_bandwidth=32 * GB, link="PCIe"),
        Hardware(name="RTX 4090", memory_bytes=24 * GB, bf16_flops=165 * T, fp8_flops=330 * T, fp32_flops=82.6 * T,
                 memory_bandwidth=1.008 * T, link_bandwidth=32 * GB, link="PCIe"),
    )
}  # fmt: skip


def hardware(name: str | None, gpu_memory: int) -> Hardware:
    """The preset called `name` (case and spaces ignored); None: the preset whose memory is nearest `gpu_memory`."""
    if name is None:
        return min(HARDWARE.values(), key=lambda h: abs(h.memory_bytes - gpu_memory))
    key = _key(name)
    for preset in HARDWARE.values():
        if _key(preset.name) == key:
            return preset
    raise PlanError(f"unknown hardware '{name}'; presets: {', '.join(HARDWARE)}.")


def _key(name: str) -> str:
    return re.sub(r"[\s_-]", "", name).lower()


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": GB, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": GIB}


def parse_memory(text) -> int:
    """Bytes from "24GiB", "80GB", "48 gb" or a plain number of bytes; PlanError otherwise.

    GB is 10^9 bytes and GiB 2^30, as on datasheets ("80 GB") and in nvidia-smi ("81559MiB").
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match.group(2).lower()
    if not match or unit not in UNITS:
        raise PlanError(f"GPU memory '{text}': write a size like 24GiB, 80GB or 49152MiB.")
    return int(float(match.group(1)) * UNITS[unit])
