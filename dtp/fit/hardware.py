"""Accelerator presets for `dtp fit`'s step-time model, and GPU memory sizes as people write them.

Public datasheet figures, dense (no 2:4 sparsity), per GPU:

    name        memory   bf16 TFLOP/s  fp8 TFLOP/s  fp32 TFLOP/s  memory TB/s  link (as shipped)     GB/s per direction
    H100 SXM    80 GB      989          1979          67          3.35        NVLink 4 (900 GB/s bidir)   450
    H200       141 GB      989          1979          67          4.8         NVLink 4 (900 GB/s bidir)   450
    A100 80GB   80 GB      312           -            19.5        2.039       NVLink 3 (600 GB/s bidir)   300
    L40S        48 GB      362           733          91.6        0.864       PCIe 4.0 x16                 32
    L20         48 GB      119.5         239          59.8        0.864       PCIe 4.0 x16                 32
    RTX 4090    24 GB      165           330          82.6        1.008       PCIe 4.0 x16                 32
    B200       180 GB     2250          4500          75          8.0         NVLink 5 (1.8 TB/s bidir)   900
    GB200      186 GB     2500          5000          80          8.0         NVLink 5 (1.8 TB/s bidir)   900

(RTX 4090: the fp32-accumulate tensor rate, which is what bf16 matmuls use. fp32: the non-tensor-core FP32 rate,
what an fp32 matmul runs at without TF32, which dtp never enables.) The link figure is what one
GPU can send while it receives as much, the bandwidth a ring collective is limited by.

Blackwell (dense = half the "with sparsity" datasheet figures; not measured here):
    B200    NVIDIA HGX B200 datasheet (https://www.nvidia.com/en-us/data-center/hgx/), per GPU of the 8-GPU board:
            180 GB HBM3e, 8 TB/s, FP16/BF16 tensor 4.5 PFLOPS sparse (2.25 dense), FP8 9 sparse (4.5 dense), FP32
            75 TFLOPS, fifth-generation NVLink 1.8 TB/s per GPU (both directions; 900 GB/s each way).
    GB200   NVIDIA GB200 NVL72 datasheet (https://www.nvidia.com/en-us/data-center/gb200-nvl72/), rack figures / 72
            GPUs: 13.4 TB HBM3e (186 GB), 576 TB/s (8 TB/s), FP16/BF16 360 PFLOPS sparse (2.5 dense each), FP8 720
            sparse (5 dense each), FP32 5,760 TFLOPS (80 each), NVLink 130 TB/s (1.8 TB/s each, 900 GB/s each way).

Between nodes (`INTER_NODE`, `dtp fit --inter-node`): what one GPU can send to another node while every GPU of its
node does the same (a ring or cfg axis that crosses nodes: each rank has its peer on the other node), i.e. the node's
NIC bandwidth / GPUs per node, and a small-message latency factor over NVLink's (assumed, not measured here:
InfiniBand / RoCE RDMA adds a few microseconds per hop to NCCL's launch cost; TCP sockets more):

    400Gb IB      one 400 Gb/s NDR InfiniBand NIC per GPU (ConnectX-7, the DGX H100 / DGX B200 compute fabric:
                  8 per 8-GPU node)                                            50 GB/s per GPU       latency x2
    800Gb IB      one 800 Gb/s XDR InfiniBand NIC per GPU (ConnectX-8)       100 GB/s per GPU       latency x2
    8x200Gb RoCE  eight 200 Gb/s RoCE NICs per node (200 GB/s a node)       200 / G GB/s per GPU   latency x2
    100GbE        one 100 Gb/s Ethernet NIC per node (TCP sockets)         12.5 / G GB/s per GPU   latency x4
    NVL72         the GB200 NVL72 rack: its 18 compute trays of 4 GPUs are joined by the NVLink switch, so "across
                  nodes" is NVLink 5 (900 GB/s per GPU, NVLink latency); at most 72 GPUs
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
        Hardware(name="B200", memory_bytes=180 * GB, bf16_flops=2250 * T, fp8_flops=4500 * T, fp32_flops=75 * T,
                 memory_bandwidth=8 * T, link_bandwidth=900 * GB, link="NVLink"),
        Hardware(name="GB200", memory_bytes=186 * GB, bf16_flops=2500 * T, fp8_flops=5000 * T, fp32_flops=80 * T,
                 memory_bandwidth=8 * T, link_bandwidth=900 * GB, link="NVLink"),
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


@dataclass(frozen=True, kw_only=True)
class InterNode:
    """The link between nodes (module docstring's table)."""

    name: str
    bandwidth: float
    """Bytes/s of the whole node (per_gpu False) or of each GPU (per_gpu True), each way."""
    per_gpu: bool
    """True: one NIC per GPU (`bandwidth` is each GPU's); False: the node's NICs shared by its GPUs."""
    latency_factor: float
    """Small-message latency of a collective over this link / over NVLink (`cost.ALPHA_NVLINK`)."""
    max_gpus: int | None = None
    """The most GPUs the fabric joins (NVL72: 72), None: no limit."""

    def gpu_bandwidth(self, gpus_per_node: int) -> float:
        """Bytes/s one GPU sends to another node while every GPU of its node does."""
        return self.bandwidth if self.per_gpu else self.bandwidth / gpus_per_node


INTER_NODE = {
    link.name: link
    for link in (
        InterNode(name="400Gb IB", bandwidth=50 * GB, per_gpu=True, latency_factor=2.0),
        InterNode(name="800Gb IB", bandwidth=100 * GB, per_gpu=True, latency_factor=2.0),
        InterNode(name="8x200Gb RoCE", bandwidth=200 * GB, per_gpu=False, latency_factor=2.0),
        InterNode(name="100GbE", bandwidth=12.5 * GB, per_gpu=False, latency_factor=4.0),
        InterNode(name="NVL72", bandwidth=900 * GB, per_gpu=True, latency_factor=1.0, max_gpus=72),
    )
}


def inter_node(name: str) -> InterNode:
    """The inter-node preset called `name` (case, spaces, "-" and "_" ignored); PlanError naming the presets."""
    for preset in INTER_NODE.values():
        if _key(preset.name) == _key(name):
            return preset
    raise PlanError(f"unknown inter-node link '{name}'; presets: {', '.join(repr(n) for n in INTER_NODE)}.")


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
