"""FSDP's cost in `dtp fit`: a row measured without FSDP, turned into the same row with `fsdp=True` (`runtime/fsdp.py`).

FSDP changes neither the FLOPs nor the TP/CP collectives of a call; it divides the resident weights of every
FSDP-sharded component by F = cfg x cp and gathers each block back just before it runs:

    weight_bytes[c]   = measured x (blocks' share / F + root's share)     (c: the transformer; text encoders when
                        sharded; the root, outside the blocks, stays gathered after the first call)
    transient         = 2 x the largest block at tp while denoising (the block running and the prefetched next one),
                        1 x in the other phases (the last block prefetched the first for the next call); measured
                        on gloo (tests/distributed/test_fsdp_more.py: 2.11 blocks with the gathered root, 3.11 before
                        runtime/fsdp.py freed each all-gather buffer at its copy-out)
    peak              = max over phases of (resident weights + transient + phase activations)
    gather per call   = all_gather of the blocks' tp-local weights over F ranks: (F - 1) / F x their bytes on
                        the link, one collective per block (its latency paid per block)
    step_seconds      = measured + calls x max(0, gather - call)
                        prefetch hides block i+1's gather behind block i's compute, and the last block prefetches
                        the first for the next call: only what the compute cannot hide is exposed

Example (`dtp fit flux-pipeline --gpus 8 --gpu-memory 80GB --resolution 2048`, bf16, H100, cp=8): 23.8 GB of
transformer weights -> 3.09 GB per rank (0.11 GB of it the gathered root), + 2 x 0.68 GB of gathered double blocks;
20.7 GB per call all-gathered over NVLink, hidden behind the call's compute (0.0961 s/step, as without FSDP).
"""

from __future__ import annotations

from ..runtime.fsdp import block_lists
from . import cost


def fsdp_supported(pipeline, c) -> str | None:
    """Why `fsdp=True` cannot run with the rest of candidate `c`, or None."""
    if not c.fsdp:
        return None
    if c.cfg * c.cp == 1:
        return "fsdp: no non-tp axis (cfg x cp = 1) to shard the weights over"
    if c.quant is not None:
        return "fsdp: torchao's quantized weights cannot be gathered by FSDP2"
    return None


_FRACTIONS: dict = {}


def block_fraction(pipeline, name: str, dtype) -> tuple[float, int]:
    """(largest block's share, all blocks' share of the component's parameters, number of blocks) from its full-size
    meta build."""
    key = (pipeline.name, pipeline.model_dir, name, str(dtype))
    if key not in _FRACTIONS:
        _FRACTIONS[key] = _fraction(pipeline.build(name, dtype))
    return _FRACTIONS[key]


def _fraction(module) -> tuple[float, float, int]:
    total = sum(p.numel() for p in module.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for _, lst in block_lists(module) for b in lst]
    if not blocks or not total:
        return 0.0, 0.0, 0
    return max(blocks) / total, sum(blocks) / total, len(blocks)


def fsdp_row(row: dict, c, pipeline, plan, call_seconds: float, dtype, hw, memory: int) -> dict:
    """`row` (measured without FSDP) as it is with FSDP over F = cfg x cp ranks (the module docstring's model)."""
    f = c.cfg * c.cp
    name = pipeline.transformer
    sharded = {name} | (set(pipeline.text_encoders) if c.text_encoders == "sharded" else set())
    whole = row["weight_bytes"]
    weights = {n: -(-b // f) if n in sharded else b for n, b in whole.items()}
    largest, blocks, units = block_fraction(pipeline, name, dtype)
    weights[name] = int(whole[name] * (blocks / f + 1 - blocks))  # the root stays gathered
    transient = int(2 * largest * whole[name])
    resident = {p: sum(weights[n] for n in weights if p in plan.resident[n]) for p in row["phase_bytes"]}
    held = {p: transient if p == "denoise" else transient // 2 for p in resident}
    totals = {p: resident[p] + held[p] + row["phase_bytes"][p] for p in resident}
    peak_phase = max(totals, key=totals.get)
    gather = [("all_gather", int(whole[name] * blocks) // max(units, 1), f)] * units
    gather_seconds = cost.collective_seconds(gather, hw)
    exposed = max(0.0, gather_seconds - call_seconds)
    gathered = int(cost.wire_bytes("all_gather", int(whole[name] * blocks), f)) * row["calls_per_step"]
    return {
        **row,
        "weight_bytes": weights,
        "resident_bytes": resident,
        "peak_bytes": totals[peak_phase],
        "peak_phase": peak_phase,
        "fits": totals[peak_phase] <= memory,
        "step_seconds": row["step_seconds"] + row["calls_per_step"] * exposed,
        "step_collective_bytes": row["step_collective_bytes"] + gathered,
        "fsdp_gathered_bytes": gathered,
        "fsdp_transient_bytes": transient,
    }
