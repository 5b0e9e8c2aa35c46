"""Host time of one rank's forward against diffusers' unsharded model, on a fake process group, pinned to one core.

    python benchmarks/host_overhead.py                 # every mesh, FLUX.1 and Wan; writes results/host_overhead.md
    python benchmarks/host_overhead.py --repeats 41    # more alternated runs per row (default 21)
    python benchmarks/host_overhead.py --only "tp=2"   # one mesh (repeatable); prints, writes nothing
    python benchmarks/host_overhead.py --fsdp-variants # (cp=2, fsdp) with FSDP2's options varied; appends to the file
    python benchmarks/host_overhead.py --fsdp-phases   # where (cp=2, fsdp)'s host time goes in FSDP2; appends
    python benchmarks/host_overhead.py --fsdp-breakdown [--compiled]  # (cp=2, fsdp): dtp's share vs FSDP2's own
    python benchmarks/host_overhead.py --steps         # cfg=2's pair and K-pass step paths: dtp's cost per call
    python benchmarks/host_overhead.py --fsdp-units [--layers 8]  # (cp=2, fsdp) per FSDP unit size; appends
    python benchmarks/host_overhead.py --fsdp-units --phases --layers 8  # FSDP2's phases at fsdp=True and fsdp=8

Each row builds the family's TINY model (seed 0) and the same weights sharded by dtp on rank 0 of the mesh
(`dtp.testing.host`), then calls the two in turn (3 warm-up calls, then `repeats` alternated ones, no grad) and
reports the medians and their ratio; "DTensor ops" is how many aten ops of one sharded forward took a DTensor.
At tiny widths a forward is host time (Python, dispatch, launches), which does not shrink with the widths; the
collectives of a fake process group cost nothing, so the ratio is what dtp's own code adds. Targets (issue 43):
<= 1.15x at tp=2, cp=2 (Ulysses, ring), cfg=2; <= 1.30x at (cp=2, fsdp).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch

import dtp.runtime.fsdp as dtp_fsdp
from dtp.analysis.fakepg import fake_world
from dtp.testing.host import MESHES, alternated_medians, dtensor_ops, sharded_pair, tiny_inputs

MODELS = ("FluxTransformer2DModel", "WanTransformer3DModel")
TARGETS = {"cp=2 fsdp": 1.30}  # every other mesh: 1.15
RESULT = Path(__file__).parent / "results" / "host_overhead.md"


def pin_one_core() -> int:
    """Run on one core (the last one this process may use) with one torch thread; returns the core."""
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    return core


def row(class_name: str, mesh, repeats: int) -> dict:
    """One mesh's row; with fsdp also FSDP2 alone on diffusers' model at dtp's units (`fsdp_alone`), timed in the same
    alternation: what FSDP2 costs by itself, against which dtp's (cp=2, fsdp) rank is read; and both with the vectors
    sharded too (`vectors_sharded`: the rule before round 15), in the same alternation."""
    alone_ms = before = None
    with fake_world(mesh.world):
        reference, sharded = sharded_pair(class_name, mesh)
        inputs = tiny_inputs(class_name, mesh)
        ops = dtensor_ops(sharded, inputs)
        if mesh.fsdp:
            with vectors_sharded():
                _, sharded_before = sharded_pair(class_name, mesh)
                alone_before = fsdp_alone(reference, mesh.world)
            models = [reference, fsdp_alone(reference, mesh.world), alone_before, sharded_before, sharded]
            ref_ms, alone_ms, *before, dtp_ms = _median_ms(models, [inputs] * len(models), repeats)
            ref_s, dtp_s = ref_ms / 1e3, dtp_ms / 1e3
        else:
            ref_s, dtp_s = alternated_medians(reference, sharded, inputs, repeats=repeats)
    return dict(
        model=class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", ""),
        mesh=mesh.name,
        ref_ms=ref_s * 1e3,
        dtp_ms=dtp_s * 1e3,
        ratio=dtp_s / ref_s,
        target=TARGETS.get(mesh.name, 1.15),
        dtensor_ops=sum(ops.ops.values()),
        total_ops=ops.total,
        alone_ms=alone_ms,
        before_ms=before,  # (FSDP2 alone, dtp's rank) with the vectors sharded too
    )


def vectors_sharded():
    """dtp's FSDP with every vector sharded too, as before round 15 (`runtime/fsdp.VECTORS_WHOLE`), while models are
    sharded under it; their forwards keep what they were sharded with."""
    return mock.patch.object(dtp_fsdp, "VECTORS_WHOLE", False)


def table(rows: list[dict]) -> str:
    """The ratios; under each fsdp row, FSDP2 alone (diffusers' model, dtp's units, no dtp hook) against diffusers',
    and dtp's rank against FSDP2 alone (what dtp adds to FSDP2's own cost: its cp work and its hooks)."""
    lines = [
        "| model | mesh | diffusers ms | dtp rank ms | ratio | target | DTensor ops | aten ops |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mark = "" if r["ratio"] <= r["target"] else " (over)"
        lines.append(
            f"| {r['model']} | {r['mesh']} | {r['ref_ms']:.2f} | {r['dtp_ms']:.2f} | {r['ratio']:.2f}x{mark} | "
            f"{r['target']:.2f}x | {r['dtensor_ops']} | {r['total_ops']} |"
        )
        if r.get("alone_ms") is not None:
            alone = r["alone_ms"]
            lines.append(
                f"| {r['model']} | FSDP2 alone, same units (vs diffusers) | {r['ref_ms']:.2f} | {alone:.2f} | "
                f"{alone / r['ref_ms']:.2f}x | | | |"
            )
            lines.append(
                f"| {r['model']} | {r['mesh']} vs FSDP2 alone | {alone:.2f} | {r['dtp_ms']:.2f} | "
                f"{r['dtp_ms'] / alone:.2f}x | 1.15x | | |"
            )
            lines += _before_lines(r)
    return "\n".join(lines)


def _before_lines(r: dict) -> list[str]:
    """The fsdp row's twins with every vector sharded too (the rule before round 15), same alternation."""
    if not r.get("before_ms"):
        return []
    alone, rank = r["before_ms"]
    return [
        f"| {r['model']} | FSDP2 alone, vectors sharded too (before) | {r['ref_ms']:.2f} | {alone:.2f} | "
        f"{alone / r['ref_ms']:.2f}x | | | |",
        f"| {r['model']} | {r['mesh']}, vectors sharded too (before) | {r['ref_ms']:.2f} | {rank:.2f} | "
        f"{rank / r['ref_ms']:.2f}x | {r['target']:.2f}x | | |",
    ]


@contextlib.contextmanager
def fsdp_variant(name: str):
    """dtp's FSDP2 setup with one option changed (`FSDP_VARIANTS`)."""
    from torch.distributed.fsdp import FSDPModule

    shard = dtp_fsdp.fully_shard
    patches = {
        "dtp's units (blocks over 2x the smallest split)": [],
        "one unit per block": [mock.patch.object(dtp_fsdp, "SPLIT_RATIO", float("inf"))],
        "reshard_after_forward=False (whole weights kept)": [
            mock.patch.object(
                dtp_fsdp,
                "fully_shard",
                lambda m, mesh, **kw: shard(m, mesh=mesh, **{**kw, "reshard_after_forward": False}),
            )
        ],
        "vectors sharded too (before round 15)": [vectors_sharded()],
        "_set_unshard_async_op(False)": [mock.patch.object(FSDPModule, "_set_unshard_async_op", lambda self, v: None)],
    }[name]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


FSDP_VARIANTS = (
    "dtp's units (blocks over 2x the smallest split)",
    "vectors sharded too (before round 15)",
    "one unit per block",
    "reshard_after_forward=False (whole weights kept)",
    "_set_unshard_async_op(False)",
)


def fsdp_rows(repeats: int) -> str:
    mesh = next(m for m in MESHES if m.fsdp)
    lines = ["| model | FSDP2 setup (cp=2, fsdp) | diffusers ms | dtp rank ms | ratio |", "|---|---|---:|---:|---:|"]
    for class_name in MODELS:
        for name in FSDP_VARIANTS:
            with fsdp_variant(name):
                r = row(class_name, mesh, repeats)
            lines.append(f"| {r['model']} | {name} | {r['ref_ms']:.2f} | {r['dtp_ms']:.2f} | {r['ratio']:.2f}x |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


# FSDP2's phases of one unit's forward (torch 2.13's private names): a unit's pre-forward hook waits for its
# all-gather and copies the gathered parameters out, then issues its prefetch window's all-gathers (copy-in, the
# collective); its post-forward hook frees the gathered parameters.
FSDP_PHASES = (
    ("pre-forward hook (total)", "_fsdp_state:FSDPState._pre_forward"),
    ("  wait for the unit's gather + copy-out", "_fsdp_param_group:FSDPParamGroup.wait_for_unshard"),
    ("    copy-out (split into parameters)", "_fsdp_collectives:foreach_all_gather_copy_out"),
    ("  prefetch: issue the window's gathers", "_fsdp_param_group:FSDPParamGroup._prefetch_unshard"),
    ("    copy-in + all-gather call", "_fsdp_collectives:foreach_all_gather"),
    ("post-forward hook (total)", "_fsdp_state:FSDPState._post_forward"),
    ("  reshard (free the gathered parameters)", "_fsdp_param_group:FSDPParamGroup.reshard"),
)


def _timer(fn, label: str, spent: dict, calls: dict):
    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - start
            calls[label] += 1

    return timed


@contextlib.contextmanager
def fsdp_timers(spent: dict, calls: dict):
    """FSDP2's phase functions wrapped to add their thread CPU time into `spent` (and counts into `calls`), patched
    on their classes and modules before `fully_shard` binds its hooks; restored after."""
    with contextlib.ExitStack() as stack:
        for label, where in FSDP_PHASES:
            module_name, name = where.split(":")
            owner = importlib.import_module(f"torch.distributed.fsdp._fully_shard.{module_name}")
            *cls, attr = name.split(".")
            target = getattr(owner, cls[0]) if cls else owner

            timed = _timer(getattr(target, attr), label, spent, calls)
            stack.enter_context(mock.patch.object(target, attr, timed))
            if not cls:  # a module-level function is also called by the name other FSDP2 modules imported
                for other in ("_fsdp_param_group",):
                    module = importlib.import_module(f"torch.distributed.fsdp._fully_shard.{other}")
                    if hasattr(module, attr):
                        stack.enter_context(mock.patch.object(module, attr, timed))
        yield


def fsdp_phase_rows(repeats: int) -> str:
    """Per model: ms per forward of (cp=2, fsdp) in each FSDP2 phase (with the timers' own cost), beside the forward
    with the same timers and the unsharded one."""
    mesh = next(m for m in MESHES if m.fsdp)
    lines = ["| model | units | phase | ms / forward | calls / forward |", "|---|---:|---|---:|---:|"]
    for class_name in MODELS:
        spent, calls = defaultdict(float), defaultdict(int)
        with fsdp_timers(spent, calls), fake_world(mesh.world):
            reference, sharded = sharded_pair(class_name, mesh)
            inputs = tiny_inputs(class_name, mesh)
            units = sum(1 for m in sharded.modules() if isinstance(m, torch.distributed.fsdp.FSDPModule))
            with torch.no_grad():
                for _ in range(3):
                    sharded(**inputs)
                spent.clear(), calls.clear()
                times = []
                for _ in range(repeats):
                    start = time.thread_time()
                    sharded(**inputs)
                    times.append(time.thread_time() - start)
            ref_s, _ = alternated_medians(reference, reference, inputs, repeats=repeats)
        model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
        lines.append(f"| {model} | {units} | whole forward (timers on) | {statistics.median(times) * 1e3:.2f} | 1 |")
        lines.append(f"| {model} | | diffusers' unsharded forward | {ref_s * 1e3:.2f} | 1 |")
        for label, _ in FSDP_PHASES:
            lines.append(f"| {model} | | {label} | {spent[label] / repeats * 1e3:.2f} | {calls[label] / repeats:.0f} |")
        print("\n".join(lines[-len(FSDP_PHASES) - 2 :]), flush=True)
    return "\n".join(lines)


def fsdp_alone(reference: torch.nn.Module, world: int) -> torch.nn.Module:
    """A copy of diffusers' model under FSDP2 alone: `fully_shard` on the units dtp's `unit_layout` picks (children
    before their block, `reshard_after_forward=True`) and the root (False), the vectors left out as dtp leaves them
    (`fsdp_shards`; under `vectors_sharded()` the rule before), on a 1-D mesh of `world` ranks, with
    FSDP2's own (implicit) prefetching and no dtp hook: what FSDP2 costs by itself at dtp's units."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(reference)
    mesh = init_device_mesh("cpu", (world,))
    layout = dtp_fsdp.unit_layout(model)
    whole = {p for p in model.parameters() if not dtp_fsdp.fsdp_shards(p)}  # dtp's rule on vectors, as it stands
    for unit in reversed(layout.units):
        fully_shard(unit.module, mesh=mesh, reshard_after_forward=True, ignored_params=whole)
    fully_shard(model, mesh=mesh, reshard_after_forward=False, ignored_params=whole)
    dtp_fsdp.name_repeated_blocks(model, layout)  # so that regional compile finds the renamed units
    return model


# fsdp= values: no fsdp (dtp's cp work alone), dtp's units, blocks per unit, a byte budget per unit
FSDP_UNITS = (False, True, 1, 2, 4, 8, "1MB")


def deep_tiny(class_name: str, layers: int) -> torch.nn.Module:
    """The family's tiny model (seed 0) with `layers` blocks in each block list (FLUX.1: `layers` double and
    2 x `layers` single blocks, as FLUX.1-dev's 19 / 38), widths unchanged: per-block host time as at full depth."""
    from dtp.families import FAMILIES, model_class

    extra = {"num_layers": layers} | ({"num_single_layers": 2 * layers} if "Flux" in class_name else {})
    torch.manual_seed(0)
    return model_class(class_name).from_config({**FAMILIES[class_name].tiny, **extra}).eval()


def fsdp_unit_rows(repeats: int, layers: int) -> str:
    """Per model: diffusers' unsharded forward and dtp's (cp=2, fsdp) rank at each unit size of `FSDP_UNITS`, all
    called in turn (one alternation, so load drifts hit every column alike), beside each unit size's gathering units
    and its bytes per rank (`runtime/fsdp`: resident between calls, in flight while the blocks run; the peak's
    weights are their sum)."""
    import copy

    import dtp
    from dtp.runtime.fsdp import in_flight_bytes, resident_bytes
    from dtp.runtime.memory import local_param_bytes

    mesh = next(m for m in MESHES if m.fsdp)
    lines = [
        f"| model ({layers} blocks a list) | fsdp= | units | diffusers ms | dtp rank ms | ratio | resident kB | "
        "in flight kB | weights' peak kB | whole kB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for class_name in MODELS:
        with fake_world(mesh.world):
            reference = deep_tiny(class_name, layers)
            device_mesh = dtp.make_mesh(cp=mesh.cp, device_type="cpu")
            sharded = [dtp.parallelize(copy.deepcopy(reference), device_mesh, fsdp=u) for u in FSDP_UNITS]
            inputs = tiny_inputs(class_name, mesh)
            ref_ms, *dtp_ms = _shuffled_median_ms([reference, *sharded], inputs, repeats)
        model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
        whole = local_param_bytes(reference) / 1e3
        for unit, model_s, ms in zip(FSDP_UNITS, sharded, dtp_ms):
            if unit is False:  # cp=2 alone: every weight whole on the rank, nothing gathered
                units, resident, flight = 0, whole, 0.0
            else:
                units = len(getattr(model_s, dtp_fsdp.LAYOUT_ATTR).gathered())
                resident, flight = resident_bytes(model_s) / 1e3, in_flight_bytes(model_s) / 1e3
            lines.append(
                f"| {model} | {unit} | {units} | {ref_ms:.2f} | {ms:.2f} | {ms / ref_ms:.2f}x | {resident:.0f} | "
                f"{flight:.0f} | {resident + flight:.0f} | {whole:.0f} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines)


def _shuffled_median_ms(models: list, inputs: dict, repeats: int, warmup: int = 3) -> list[float]:
    """Median thread CPU ms of each `models[i](**inputs)`, all called in each round, in an order shuffled every round
    (seeded): a model run right after another pays for it (measured: tiny Wan's fsdp=True and fsdp=1, the same units,
    17.9 and 16.3 ms when True always ran right after the unsharded cp=2 model)."""
    import random

    times: list[list[float]] = [[] for _ in models]
    order, shuffle = list(range(len(models))), random.Random(0).shuffle
    with torch.no_grad():
        for i in range(warmup + repeats):
            shuffle(order)
            for j in order:
                start = time.thread_time()
                models[j](**inputs)
                if i >= warmup:
                    times[j].append(time.thread_time() - start)
    return [statistics.median(t) * 1e3 for t in times]


def fsdp_unit_phase_rows(repeats: int, layers: int, units=(True, 8)) -> str:
    """Per model (`deep_tiny` with `layers` blocks a list) and unit size: ms per (cp=2, fsdp) forward in each FSDP2
    phase (`FSDP_PHASES`, the timers' own cost included) and the calls a forward makes to it: which phases shrink
    with fewer units and which stay (one model timed at a time, medians of `repeats` forwards)."""
    import copy

    import dtp

    mesh = next(m for m in MESHES if m.fsdp)
    head = " | ".join(f"fsdp={u} ms | calls" for u in units)
    lines = [f"| model ({layers} blocks a list) | phase | {head} |", "|---|---|" + "---:|---:|" * len(units)]
    for class_name in MODELS:
        columns = []
        for unit in units:
            spent, calls = defaultdict(float), defaultdict(int)
            with fsdp_timers(spent, calls), fake_world(mesh.world):
                reference = deep_tiny(class_name, layers)
                device_mesh = dtp.make_mesh(cp=mesh.cp, device_type="cpu")
                sharded = dtp.parallelize(copy.deepcopy(reference), device_mesh, fsdp=unit)
                inputs, times = tiny_inputs(class_name, mesh), []
                with torch.no_grad():
                    for i in range(3 + repeats):
                        if i == 3:
                            spent.clear(), calls.clear()
                        start = time.thread_time()
                        sharded(**inputs)
                        times.append(time.thread_time() - start)
            column = {"whole forward (timers on)": (statistics.median(times[3:]) * 1e3, 1)}
            column |= {label: (spent[label] / repeats * 1e3, calls[label] / repeats) for label, _ in FSDP_PHASES}
            columns.append(column)
        model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
        for label in columns[0]:
            cells = " | ".join(f"{c[label][0]:.2f} | {c[label][1]:.0f}" for c in columns)
            lines.append(f"| {model} | {label} | {cells} |")
        print("\n".join(lines[-len(columns[0]) :]), flush=True)
    return "\n".join(lines)


FULL_SIZE_UNITS = (True, 1, 2, 4, 8, "1GB", "2GB")


def full_size_unit_rows(ranks: int = 8) -> str:
    """FLUX.1-dev and Wan 2.1 14B at their released configs (bf16, meta, tp=1) per unit size: the gathering units
    per forward, the largest, the bytes in flight (`FsdpUnits.in_flight`: a unit and its prefetched successor), and
    a rank's weights while the blocks run over `ranks` fsdp ranks (blocks / ranks + the gathered root + in flight)."""
    from dtp.analysis.fakepg import meta_model
    from dtp.runtime.fsdp import block_lists
    from dtp.runtime.memory import local_param_bytes

    lines = [
        f"| model (bf16) | fsdp= | units | largest unit GB | in flight GB | weights while denoising, F={ranks}, GB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for class_name in MODELS:
        model = meta_model(class_name, None, torch.bfloat16)
        blocks = sum(local_param_bytes(b) for _, lst in block_lists(model) for b in lst)
        root = local_param_bytes(model) - blocks
        for unit in FULL_SIZE_UNITS:
            layout = dtp_fsdp.unit_layout(model, unit)
            sizes = [u.size for u in layout.gathered()]
            flight = layout.in_flight()
            lines.append(
                f"| {type(model).__name__} | {unit} | {len(sizes)} | {max(sizes) / 1e9:.2f} | {flight / 1e9:.2f} | "
                f"{(blocks / ranks + root + flight) / 1e9:.2f} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines)


def _median_ms(models: list, inputs: list[dict], repeats: int, warmup: int = 3) -> list[float]:
    """Median thread CPU ms of each `models[i](**inputs[i])`, the models called in turn (no grad)."""
    times: list[list[float]] = [[] for _ in models]
    with torch.no_grad():
        for i in range(warmup + repeats):
            for model, kwargs, out in zip(models, inputs, times):
                start = time.thread_time()
                model(**kwargs)
                if i >= warmup:
                    out.append(time.thread_time() - start)
    return [statistics.median(t) * 1e3 for t in times]


def fsdp_breakdown_rows(repeats: int, compiled: bool) -> str:
    """Per model, four forwards called in turn: diffusers' model (a), FSDP2 alone on it at dtp's units (b), dtp's
    (cp=2) rank (c) and dtp's (cp=2, fsdp) rank (d); FSDP2's own cost is b - a, dtp's share of (cp=2, fsdp) is
    d - b (its cp work plus what it adds to FSDP2), beside c - a (its cp work alone). `compiled`: every model's
    repeated blocks compiled (`runtime/compile.compile_blocks`, inductor; FSDP2's hooks stay outside the regions)."""
    from dtp.runtime.compile import compile_blocks

    cp_mesh = next(m for m in MESHES if m.name == "cp=2 ulysses")
    fsdp_mesh = next(m for m in MESHES if m.fsdp)
    lines = [
        "| model | form | diffusers ms (a) | FSDP2 alone ms (b) | dtp cp=2 ms (c) | dtp cp=2 fsdp ms (d) | "
        "FSDP2's own b - a | dtp cp c - a | dtp's share d - b | d / a |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for class_name in MODELS:
        with fake_world(fsdp_mesh.world):
            reference, dtp_fsdp_rank = sharded_pair(class_name, fsdp_mesh)
            _, dtp_cp_rank = sharded_pair(class_name, cp_mesh)
            alone = fsdp_alone(reference, fsdp_mesh.world)
            models = [reference, alone, dtp_cp_rank, dtp_fsdp_rank]
            if compiled:
                torch._dynamo.reset()
                for model in models:
                    compile_blocks(model, backend="inductor")
            whole = tiny_inputs(class_name, fsdp_mesh)
            a, b, c, d = _median_ms(models, [whole] * 4, repeats)
        model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
        lines.append(
            f"| {model} | {'compiled' if compiled else 'eager'} | {a:.2f} | {b:.2f} | {c:.2f} | {d:.2f} | "
            f"{b - a:.2f} | {c - a:.2f} | {d - b:.2f} | {d / a:.2f}x |"
        )
        print(lines[-1], flush=True)
    return "\n".join(lines)


def _prompts(inputs: dict) -> dict:
    """The prompt embeddings a pipeline computes once, before its denoising loop: cond, uncond (another tensor of
    the same shape) and, for LTX-2's doubled batch, [uncond, cond] concatenated once."""
    cond = inputs["encoder_hidden_states"]
    uncond = cond.flip(1)
    return {"cond": cond, "uncond": uncond, "doubled": torch.cat([uncond, cond])}


def _step_calls(inputs: dict, latents: torch.Tensor, step: int, kind: str, prompts: dict) -> list[dict]:
    """The transformer calls of one denoising step, made from `latents` as a pipeline makes them (new latents and
    timestep objects each step, the prompt embeddings of `_prompts` every step): "pair" (true CFG: cond, then uncond,
    the same latents and timestep objects); "kpass" (LTX-2's multi-pass guidance: a doubled batch [uncond, cond], then
    two calls on rows of it (the prompt's uncond rows sliced anew), the latents passed alone: 4 passes)."""
    timestep = torch.full_like(inputs["timestep"], 1000.0 - 10 * step)
    if kind == "pair":
        base = {**inputs, "hidden_states": latents, "timestep": timestep}
        return [
            {**base, "encoder_hidden_states": prompts["cond"]},
            {**base, "encoder_hidden_states": prompts["uncond"]},
        ]
    doubled = {
        **inputs,
        "hidden_states": torch.cat([latents] * 2),
        "encoder_hidden_states": prompts["doubled"],
        "timestep": torch.cat([timestep] * 2),
    }
    later = {**inputs, "hidden_states": latents, "encoder_hidden_states": prompts["doubled"][:1], "timestep": timestep}
    return [doubled, later, dict(later)]


def step_path_row(class_name: str, kind: str, steps: int) -> dict:
    """dtp's own host time per transformer call on cfg=2's `kind` step path (rank 0, fake process group): the thread
    CPU time of the wrapper's calls less that of the model forwards it ran, over `steps` steps after 3 (the first
    learns the step)."""
    from dtp.runtime.cfg import CFG_ATTR

    mesh = next(m for m in MESHES if m.name == "cfg=2")
    with fake_world(mesh.world):
        _, sharded = sharded_pair(class_name, mesh)
        wrapper = getattr(sharded, CFG_ATTR)
        inner, spent = wrapper.forward, [0.0, 0]

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - start
                spent[1] += 1

        wrapper.forward = timed
        inputs = tiny_inputs(class_name, next(m for m in MESHES if m.name == "tp=2"))  # a batch of 1
        latents, total, calls = inputs["hidden_states"], 0.0, 0
        prompts = _prompts(inputs)
        with torch.no_grad():
            for step in range(3 + steps):
                if step == 3:
                    spent[:], total = [0.0, 0], 0.0
                for arguments in _step_calls(inputs, latents, step, kind, prompts):
                    start = time.thread_time()
                    out = sharded(**arguments)[0]
                    total += time.thread_time() - start
                    calls += step >= 3
                latents = latents - 0.01 * out[: latents.shape[0]]
        stats = wrapper.steps.stats if kind == "kpass" else wrapper.stats
    model = class_name.replace("Transformer2DModel", "").replace("Transformer3DModel", "")
    return dict(
        model=model,
        kind=kind,
        calls=calls // steps,
        forwards=spent[1] / steps,
        per_call_us=(total - spent[0]) / calls * 1e6,
        forward_ms=spent[0] / max(spent[1], 1) * 1e3,
        stats=vars(stats),
    )


def step_rows(steps: int) -> str:
    lines = [
        "| model | cfg=2 path | calls / step | forwards run / step (rank 0) | dtp's own µs / call | forward ms | "
        "wrapper stats |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for class_name in MODELS:
        for kind in ("pair", "kpass"):
            r = step_path_row(class_name, kind, steps)
            lines.append(
                f"| {r['model']} | {r['kind']} | {r['calls']} | {r['forwards']:.0f} | {r['per_call_us']:.0f} | "
                f"{r['forward_ms']:.2f} | {r['stats']} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--only", action="append", help="a mesh name (e.g. 'tp=2'); prints only")
    parser.add_argument("--fsdp-variants", action="store_true", help="(cp=2, fsdp) under FSDP2 options; appends")
    parser.add_argument("--fsdp-phases", action="store_true", help="(cp=2, fsdp)'s time in FSDP2's phases; appends")
    parser.add_argument("--fsdp-breakdown", action="store_true", help="(cp=2, fsdp): dtp's share vs FSDP2's; appends")
    parser.add_argument("--compiled", action="store_true", help="with --fsdp-breakdown: the blocks compiled too")
    parser.add_argument("--steps", action="store_true", help="cfg=2's pair and K-pass step paths; appends")
    parser.add_argument("--fsdp-units", action="store_true", help="(cp=2, fsdp) per FSDP unit size; appends")
    parser.add_argument("--layers", type=int, default=2, help="with --fsdp-units: blocks per block list")
    parser.add_argument("--phases", action="store_true", help="with --fsdp-units: FSDP2's phases at fsdp=True and 8")
    args = parser.parse_args(argv)
    core = pin_one_core()
    if args.steps:
        text = step_rows(args.repeats)
        with RESULT.open("a") as out:
            out.write(
                "\n## cfg=2's step paths: dtp's own host time per transformer call\n\n"
                f"`python benchmarks/host_overhead.py --steps` ({args.repeats} steps after 3, rank 0 on a fake process "
                "group, thread CPU time of the wrapper's calls less the forwards it ran; pair: true CFG's two calls, "
                "kpass: LTX-2's doubled batch and two calls on its rows, 4 passes over 2 groups)\n\n"
                f"{text}\n"
            )
        return 0
    if args.fsdp_units and args.phases:
        text = fsdp_unit_phase_rows(args.repeats, args.layers)
        with RESULT.open("a") as out:
            out.write(
                f"\n## FSDP2's phases per unit size at (cp=2, fsdp), {args.layers} blocks a list\n\n"
                f"`python benchmarks/host_overhead.py --fsdp-units --phases --layers {args.layers}` (median forward / "
                f"mean phase time over {args.repeats} calls, thread CPU time, timers on; nested rows are part of the "
                f"row above; load average {os.getloadavg()[0]:.1f} at the end)\n\n{text}\n"
            )
        return 0
    if args.fsdp_units:
        text = fsdp_unit_rows(args.repeats, args.layers) + "\n\nAt full size:\n\n" + full_size_unit_rows()
        with RESULT.open("a") as out:
            out.write(
                f"\n## FSDP unit size at (cp=2, fsdp), {args.layers} blocks a list\n\n"
                f"`python benchmarks/host_overhead.py --fsdp-units --layers {args.layers}` (median of {args.repeats} "
                "calls, the order shuffled each round, thread CPU time, one pinned core; fsdp=False: cp=2 alone, "
                "True: dtp's units, k: k blocks a unit, '1MB': blocks grouped up to 1 MB a unit; bytes per rank from "
                f"`runtime/fsdp`, fp32; load average {os.getloadavg()[0]:.1f} at the end)\n\n{text}\n"
            )
        return 0
    if args.fsdp_breakdown:
        forms = [False, True] if args.compiled else [False]
        lines = []
        for compiled in forms:  # one table: the second form's rows without its header
            lines += fsdp_breakdown_rows(args.repeats, compiled).splitlines()[2 if lines else 0 :]
        text = "\n".join(lines)
        with RESULT.open("a") as out:
            out.write(
                "\n## (cp=2, fsdp): dtp's share against FSDP2's own\n\n"
                f"`python benchmarks/host_overhead.py --fsdp-breakdown{' --compiled' if args.compiled else ''}` "
                f"(median of {args.repeats} alternated calls, thread CPU time; b: FSDP2 alone on diffusers' model at "
                f"dtp's units, whole sequence; d - b: what dtp adds to FSDP2, its cp work included)\n\n{text}\n"
            )
        return 0
    if args.fsdp_phases:
        text = fsdp_phase_rows(args.repeats)
        with RESULT.open("a") as out:
            out.write(
                "\n## Where (cp=2, fsdp)'s host time goes in FSDP2\n\n"
                f"`python benchmarks/host_overhead.py --fsdp-phases` (median forward / mean phase time over "
                f"{args.repeats} calls, thread CPU time; nested rows are part of the row above)\n\n{text}\n"
            )
        return 0
    if args.fsdp_variants:
        text = fsdp_rows(args.repeats)
        with RESULT.open("a") as out:
            out.write(
                "\n## FSDP2's options at (cp=2, fsdp)\n\n"
                f"`python benchmarks/host_overhead.py --fsdp-variants` (median of {args.repeats})\n\n{text}\n"
            )
        return 0
    meshes = [m for m in MESHES if not args.only or m.name in args.only]
    rows = []
    for class_name in MODELS:
        for mesh in meshes:
            rows.append(row(class_name, mesh, args.repeats))
            print("\n".join(table(rows[-1:]).splitlines()[2:]), flush=True)
    text = table(rows)
    print(text)
    if not args.only:
        sections = RESULT.read_text().partition("\n## ")[1:] if RESULT.exists() else ()  # the appended ones stay
        RESULT.write_text(
            "# Host time of one rank's forward vs diffusers' unsharded model\n\n"
            f"`python benchmarks/host_overhead.py` (the thread's CPU time, median of {args.repeats} alternated runs "
            f"after 3 warm-up calls, pinned to core {core}, 1 torch thread, fake process group, tiny configs, fp32, "
            f"no grad; torch "
            f"{torch.__version__}).\n\n{text}\n" + "".join(sections)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
