"""FSDP's cost in `dtp fit`: a row measured without FSDP, turned into the same row with `fsdp=True` (`runtime/fsdp.py`).

FSDP changes neither the FLOPs nor the TP/CP collectives of a call; it divides the resident weights of every
FSDP-sharded component over F = cfg x cp ranks and gathers each unit back just before it runs. Every figure is
traced, not estimated: each sharded component (the transformer; text encoders when sharded) is sharded with fsdp=True
at full size on meta as the run shards it (`analysis/fsdp.traced_fsdp`, the function `dtp check --fsdp` prints):

    weight_bytes[c]   = its traced resident bytes (units' chunks + the root gathered after the first call + the
                        vectors, whole on every rank: `runtime/fsdp.fsdp_shards`)
    in flight         = the traced running unit + its prefetch window (or a unit's copy-out, buffer and parameters
                        both alive: `runtime/fsdp.in_flight`), at the unit size `dtp fit --fsdp-unit` gives
                        (`dtp run --fsdp UNIT`; dtp's units by default), on top of the resident weights in the phase
                        the component runs in (denoise: the transformer; text: the largest sharded text encoder);
                        nothing in the decode (the pipeline frees the window the last call prefetched before its VAE
                        decodes: `pipeline/parallelize.release_before_decode`); measured on gloo against
                        `runtime/fsdp.in_flight_bytes` (tests/distributed/test_fsdp_more.py: 0.81 x in flight + root;
                        test_fsdp_unit.py at fsdp=2: 0.95 x)
    peak              = max over phases of (resident weights + in flight + phase activations)
    gather per call   = one all_gather per unit of the transformer's (F - 1) / F x its tp-local bytes on the link
    step_seconds      = measured + calls x (max(0, gather - call) + copy-out): each unit issues the next window
                        behind its compute, the last unit the first window for the next call: only what the compute
                        cannot hide is exposed; FSDP2's copy-out of each gathered unit runs on the compute stream
                        (`_fsdp_param_group.py`): 2 x unit bytes / memory bandwidth per unit and call

Example (`dtp fit flux-pipeline --gpus 8 --gpu-memory 80GB --resolution 2048`, bf16, H100, cp=8): 23.8 GB of
transformer weights -> 3.09 GB per rank (0.11 GB of it the gathered root), + 0.57 GB in flight (two single blocks;
the double blocks are split into units of at most 0.15 GB); T5 9.5 GB -> 1.42 GB (its 0.26 GB embedding gathered)
+ 0.77 GB in flight in the text phase.
"""

from __future__ import annotations

import copy

from ..analysis.fsdp import FsdpFigures, traced_fsdp
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


_TEMPLATES: dict = {}
_FIGURES: dict = {}


def component_figures(pipeline, name: str, c, setup, dtype, unit=True) -> FsdpFigures | None:
    """Component `name` of `pipeline` traced with fsdp=`unit` (True or a unit size) on candidate `c`'s mesh at its
    `setup` (tp, pad); None when it has no plan (held whole). Built once per component, traced once per mesh."""
    key = (pipeline.name, pipeline.model_dir, name, str(dtype), setup.tp, setup.pad, c.cfg, c.cp, unit)
    if key not in _FIGURES:
        source = (pipeline.name, pipeline.model_dir, name, str(dtype))
        if source not in _TEMPLATES:
            _TEMPLATES[source] = pipeline.build(name, dtype)
        module = copy.deepcopy(_TEMPLATES[source])  # sharding mutates it; a meta copy costs next to nothing
        # A candidate without a cp axis has no cp_mode (None); FSDP's bytes do not depend on it.
        # USP's mesh is the plain (cfg, cp, tp) one plus side groups: FSDP's bytes are those of its ring twin
        mode = {None: "ulysses", "usp": "ring"}.get(c.cp_mode, c.cp_mode)
        options = dict(tp=setup.tp, cp=c.cp, cfg=c.cfg, cp_mode=mode, pad=setup.pad, fsdp=unit)
        _FIGURES[key] = traced_fsdp(name, module, **options)
    return _FIGURES[key]


def fsdp_row(
    row: dict, c, pipeline, plan, call_seconds: float, dtype, hw, memory: int, network=cost.ONE_NODE, unit=True
) -> dict:
    """`row` (measured without FSDP) as it is with FSDP over F = cfg x cp ranks (the module docstring's model) in
    units of `unit` (`fsdp=` as `dtp run --fsdp UNIT` takes it); its gathers on the inter-node link where the fsdp
    axis crosses nodes (`network`)."""
    f, name = c.cfg * c.cp, pipeline.transformer
    sharded = [name] + (list(pipeline.text_encoders) if c.text_encoders == "sharded" else [])
    traced = {n: component_figures(pipeline, n, c, plan.setups[n], dtype, unit) for n in sharded}
    traced = {n: figures for n, figures in traced.items() if figures is not None}
    weights = {**row["weight_bytes"], **{n: figures.resident for n, figures in traced.items()}}
    encoders = [traced[n].in_flight for n in pipeline.text_encoders if n in traced]
    held = {"text": max(encoders, default=0), "denoise": traced[name].in_flight, "decode": 0}
    resident = {p: sum(weights[n] for n in weights if p in plan.resident[n]) for p in row["phase_bytes"]}
    totals = {p: resident[p] + held.get(p, 0) + row["phase_bytes"][p] for p in resident}
    peak_phase = max(totals, key=totals.get)
    units = traced[name].units
    gather = cost.collective_seconds([("all_gather", size, f, "fsdp") for size in units], hw, network)
    exposed = max(0.0, gather - call_seconds) + cost.fsdp_copy_out_seconds(units, hw)
    gathered = int(cost.wire_bytes("all_gather", sum(units), f)) * row["calls_per_step"]
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
        "fsdp_transient_bytes": held["denoise"],
        "fsdp_in_flight_bytes": held,
    }
