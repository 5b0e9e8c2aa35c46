"""The step-time model of `dtp fit`: traced FLOPs and collective bytes over a preset's peak rates.

One transformer call on one rank takes

    compute     = max(FLOPs at tensor-core rates + fp32 FLOPs at the fp32 rate,  weight bytes / memory bandwidth)
                  where a rate is the datasheet peak x MATMUL_EFFICIENCY; x EAGER_FACTOR when not compiled
    collectives = sum over collectives of  ALPHA[kind] + wire bytes / link bandwidth
    call        = compute + collectives        (no overlap of communication with compute assumed)

and a denoising step is `calls_per_step` calls (2 for pipelines that run CFG as two calls). FLOPs are
the matmul, convolution and attention FLOPs of the transformer's forward traced on fake CUDA tensors on this
rank's local shapes (`trace.PhaseTrace`, `analysis/cuda.py`): the code as a GPU runs it, so an attention done in
fp32 matmuls (dtp's ring block before its fused kernels) is costed at the fp32 (SIMT) rate, a fused one at the
tensor-core rate. Elementwise work is left out (memory-bound and small next to them at these sizes).

Compiled or eager: MATMUL_EFFICIENCY (0.6 of peak) matches compiled runs; eager runs measured slower on an H200
(`benchmarks/results/gpu_check.md`, medium FLUX.1 at 1024^2, tp=1): diffusers 18.8 ms eager vs 13.9 ms compiled
(1.35x), dtp 22.8 ms vs 15.6 ms (1.46x). dtp's rows use dtp's ratio: eager compute = compiled compute x 1.46.

Wire bytes per rank of a collective whose full result is B bytes over a group of n ranks (ring
algorithms, what NCCL uses on one node):

    all_reduce          2 (n - 1) / n x B        (reduce-scatter then all-gather)
    all_gather          (n - 1) / n x B          (B = the gathered tensor)
    reduce_scatter      (n - 1) x B              (B = this rank's 1/n result)
    all_to_all          (n - 1) / n x B          (B = this rank's result; Ulysses CP)
    send / recv         B                        (ring CP: one K/V chunk per hop)

e.g. an all-reduce of a [1, 4608, 3072] bf16 activation (28.3 MB) at tp=4 over NVLink 450 GB/s:
2 x 3/4 x 28.3 MB / 450 GB/s = 94 us (+ ALPHA["all_reduce"], 25 us).

Across nodes (`Network`): a collective on a mesh axis whose groups span nodes (`placement.crossing_axes`) runs at
the inter-node link's per-GPU bandwidth with its latency factor (`hardware.INTER_NODE`), the whole collective at
that rate: a ring over two nodes moves every byte through its slowest hop, and every GPU of a node sends at once.
e.g. the cfg exchange of Wan 2.1 at 720p x 81 frames (2 x 7.7 MB gathered) over 400Gb IB (50 GB/s per GPU):
1/2 x 15.5 MB / 50 GB/s = 155 us + 2 x 20 us.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import Hardware, InterNode

MATMUL_EFFICIENCY = 0.6  # fraction of datasheet peak large bf16 matmuls and flash attention sustain (compiled)
EAGER_FACTOR = 22.8 / 15.6  # dtp eager / compiled on an H200 (gpu_check.md): 1.46
# Fixed cost per collective (launch + latency) by kind, on NVLink (one node, NVSwitch). Round figures inside the
# range published for NCCL on small messages (<= 64 KB) on 8 x H100 / H200 NVSwitch nodes - nccl-tests'
# all_reduce_perf / all_gather_perf / alltoall_perf / sendrecv_perf latencies of ~20-40 us for the collectives and
# ~10-20 us for a point-to-point transfer (the range `research/gpu-path-review.md` section 3 cites; not measured
# here): all-to-all is the slowest (every pair of ranks), a send or receive the fastest.
ALPHA_NVLINK = {
    "all_reduce": 25e-6,
    "all_gather": 20e-6,
    "reduce_scatter": 20e-6,
    "all_to_all": 30e-6,
    "send_recv": 15e-6,
    "broadcast": 20e-6,
}
PCIE_LATENCY_FACTOR = 2.0  # PCIe peers (no NVSwitch): about twice NVLink's small-message latency


def wire_bytes(op: str, nbytes: int, group: int) -> float:
    """Bytes one rank sends for collective `op` whose result is `nbytes`, over `group` ranks (table above)."""
    if group <= 1:
        return 0.0
    if op in ("allreduce", "all_reduce", "all_reduce_coalesced"):
        return 2 * (group - 1) / group * nbytes
    if op in ("reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_", "_reduce_scatter_base"):
        return (group - 1) * nbytes
    if op in ("send", "recv", "broadcast"):
        return float(nbytes)
    return (group - 1) / group * nbytes  # all_gather*, all_to_all*


def collective_kind(op: str) -> str:
    """The `ALPHA_NVLINK` kind of a traced collective op ("allreduce", "all_gather_into_tensor", "alltoall_base",
    "send", ...)."""
    name = op.replace("_", "")
    for kind, prefixes in (
        ("all_reduce", ("allreduce",)),
        ("all_to_all", ("alltoall",)),
        ("reduce_scatter", ("reducescatter",)),
        ("send_recv", ("send", "recv")),
        ("broadcast", ("broadcast",)),
    ):
        if name.startswith(prefixes):
            return kind
    return "all_gather"


def latency(op: str, hw: Hardware) -> float:
    """Seconds of fixed cost of one collective `op` on `hw`'s links (`ALPHA_NVLINK`, x2 on PCIe)."""
    alpha = ALPHA_NVLINK[collective_kind(op)]
    return alpha if hw.link == "NVLink" else alpha * PCIE_LATENCY_FACTOR


@dataclass(frozen=True)
class Network:
    """The mesh axes that cross nodes (`placement.crossing_axes`) and the link they cross."""

    crossing: frozenset = frozenset()
    link: InterNode | None = None
    gpus_per_node: int = 1


ONE_NODE = Network()


def collective_seconds(records, hw: Hardware, network: Network = ONE_NODE) -> float:
    """Seconds of `(op, result bytes, group size[, mesh axis])` collectives on `hw`'s links, or on `network`'s
    inter-node link for an axis that crosses nodes (module docstring)."""
    total = 0.0
    for op, nbytes, group, *axis in records:
        if group <= 1:
            continue
        if axis and axis[0] in network.crossing:
            alpha = ALPHA_NVLINK[collective_kind(op)] * network.link.latency_factor
            total += alpha + wire_bytes(op, nbytes, group) / network.link.gpu_bandwidth(network.gpus_per_node)
        else:
            total += latency(op, hw) + wire_bytes(op, nbytes, group) / hw.link_bandwidth
    return total


def compute_seconds(
    flops: float, weight_bytes: int, hw: Hardware, *, fp8: bool = False, fp32_flops: float = 0, compiled: bool = True
) -> float:
    """Roofline seconds of `flops` (of which `fp32_flops` run without tensor cores) with `weight_bytes` read once
    (fp8: the preset's fp8 peak), x EAGER_FACTOR when not `compiled`."""
    peak = hw.fp8_flops if fp8 and hw.fp8_flops else hw.bf16_flops
    math = (flops - fp32_flops) / (peak * MATMUL_EFFICIENCY) + fp32_flops / (hw.fp32_flops * MATMUL_EFFICIENCY)
    seconds = max(math, weight_bytes / hw.memory_bandwidth)
    return seconds if compiled else seconds * EAGER_FACTOR


def call_seconds(
    flops: float,
    weight_bytes: int,
    collectives,
    hw: Hardware,
    *,
    fp8: bool = False,
    fp32_flops: float = 0,
    compiled: bool = True,
    network: Network = ONE_NODE,
) -> float:
    """One transformer call on one rank: compute + collectives (the module docstring's model)."""
    compute = compute_seconds(flops, weight_bytes, hw, fp8=fp8, fp32_flops=fp32_flops, compiled=compiled)
    return compute + collective_seconds(collectives, hw, network)


def fsdp_copy_out_seconds(unit_bytes, hw: Hardware) -> float:
    """FSDP2's copy-out after each unit's all-gather, on the compute stream: every unsharded byte read and written
    once (2 x unit bytes / memory bandwidth per unit and call)."""
    return 2 * sum(unit_bytes) / hw.memory_bandwidth
