"""The step-time model of `dtp fit`: traced FLOPs and collective bytes over a preset's peak rates.

One transformer call on one rank takes

    compute     = max(FLOPs / (peak FLOP/s x MATMUL_EFFICIENCY),  weight bytes / memory bandwidth)
    collectives = sum over collectives of  ALPHA + wire bytes / link bandwidth
    call        = compute + collectives        (no overlap of communication with compute assumed)

and a denoising step is `calls_per_step` calls (2 for pipelines that run CFG as two calls). FLOPs are
the matmul, convolution and attention FLOPs of the traced forward on this rank's local shapes
(`trace.PhaseTrace`); elementwise work is left out (memory-bound and small next to them at these sizes).

Wire bytes per rank of a collective whose full result is B bytes over a group of n ranks (ring
algorithms, what NCCL uses on one node):

    all_reduce          2 (n - 1) / n x B        (reduce-scatter then all-gather)
    all_gather          (n - 1) / n x B          (B = the gathered tensor)
    reduce_scatter      (n - 1) x B              (B = this rank's 1/n result)
    all_to_all          (n - 1) / n x B          (B = this rank's result; Ulysses CP)
    send / recv         B                        (ring CP: one K/V chunk per hop)

e.g. an all-reduce of a [1, 4608, 3072] bf16 activation (28.3 MB) at tp=4 over NVLink 450 GB/s:
2 x 3/4 x 28.3 MB / 450 GB/s = 94 us (+ ALPHA).
"""

from __future__ import annotations

from .hardware import Hardware

MATMUL_EFFICIENCY = 0.6  # fraction of datasheet peak large bf16 matmuls and flash attention sustain
ALPHA_SECONDS = {"NVLink": 10e-6, "PCIe": 25e-6}  # fixed cost per collective (launch + latency)


def wire_bytes(op: str, nbytes: int, group: int) -> float:
    """Bytes one rank sends for collective `op` whose result is `nbytes`, over `group` ranks (table above)."""
    if group <= 1:
        return 0.0
    if op in ("allreduce", "all_reduce", "all_reduce_coalesced"):
        return 2 * (group - 1) / group * nbytes
    if op in ("reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_"):
        return (group - 1) * nbytes
    if op in ("send", "recv", "broadcast"):
        return float(nbytes)
    return (group - 1) / group * nbytes  # all_gather*, all_to_all*


def collective_seconds(records, hw: Hardware) -> float:
    """Seconds of `(op, result bytes, group size)` collectives on `hw`'s links."""
    alpha = ALPHA_SECONDS[hw.link]
    return sum(alpha + wire_bytes(op, nbytes, group) / hw.link_bandwidth for op, nbytes, group in records if group > 1)


def compute_seconds(flops: float, weight_bytes: int, hw: Hardware, *, fp8: bool = False) -> float:
    """Roofline seconds of `flops` with `weight_bytes` read once (fp8: the preset's fp8 peak)."""
    peak = hw.fp8_flops if fp8 and hw.fp8_flops else hw.bf16_flops
    return max(flops / (peak * MATMUL_EFFICIENCY), weight_bytes / hw.memory_bandwidth)


def call_seconds(flops: float, weight_bytes: int, collectives, hw: Hardware, *, fp8: bool = False) -> float:
    """One transformer call on one rank: compute + collectives (the module docstring's model)."""
    return compute_seconds(flops, weight_bytes, hw, fp8=fp8) + collective_seconds(collectives, hw)
