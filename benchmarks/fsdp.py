"""FSDP (fsdp=True) on gloo: per-rank weights and peak, step time, and the tp=1 forward against diffusers'.

    python benchmarks/fsdp.py            # parts 1-3, ~5 min on 2 cores; writes benchmarks/results/fsdp.md
    python benchmarks/fsdp.py --step     # part 2 only (on idle cores: it times): replaces that section of fsdp.md
    python benchmarks/fsdp.py --memory   # part 1 only (--forward: part 3 only); the other sections are kept
    python benchmarks/fsdp.py --fit      # the full-size `dtp fit` figures of issue 33 (~5 min): fsdp_fit.md

A medium FLUX.1 transformer (width 256, 2 double + 6 single blocks: blocks are most of the weights, as at full
size), fp32, CPU, 2 or 4 gloo processes:
1. per-rank parameter bytes at rest and the forward's peak of live tensors (torch's MemTracker), with and without
   fsdp, on (cp=2), (cp=2, tp=2) and (cfg=2, a batch of 2), against whole / world + the two largest blocks / tp;
2. one (cp=2) forward's wall time with and without fsdp at 256, 1024, 2048 and 4096 image tokens, median of 5, the
   two models called in turn (issue 33's target: <= 1.15x);
3. tp=1, cfg=2: a rank's eager forward on its half of a batch of 2 against diffusers' unsharded forward on that
   half, median of 7 (target <= 1.05x: no DTensor dispatch on the compute path).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from dtp.testing.launch import spawn

CONFIG = dict(
    patch_size=1,
    in_channels=16,
    num_layers=2,
    num_single_layers=6,
    attention_head_dim=64,
    num_attention_heads=4,
    joint_attention_dim=64,
    pooled_projection_dim=32,
    guidance_embeds=False,
    axes_dims_rope=(8, 28, 28),
)
MESHES = {"cp=2": (2, dict(cp=2)), "cp=2 x tp=2": (4, dict(cp=2, tp=2)), "cfg=2": (2, dict(cfg=2))}
REPEATS, FORWARD_REPEATS = 5, 21
# Image tokens of the cp=2 step-time rows. Per rank, 2 T / (F b) FLOP per gathered byte: 2048 -> ~530 (FLUX.1-dev bf16
# at cp=8, 1024²: ~580), 4096 -> ~1,040 (at 2048²: ~2,100). docs/fsdp.md, "What it costs".
TOKENS = (256, 1024, 2048, 4096)
RESULT = Path(__file__).parent / "results" / "fsdp.md"
FIT_RESULT = Path(__file__).parent / "results" / "fsdp_fit.md"
FIT_CASES = {
    "flux-pipeline 8 x H100 80GB 2048^2": dict(pipeline="flux-pipeline", gpus=8, gpu_memory="80GB", resolution=2048),
    "wan-pipeline 4 x RTX 4090 24GB 720x1280x81": dict(
        pipeline="wan-pipeline", gpus=4, gpu_memory="24GB", height=720, width=1280, frames=81, hardware="RTX 4090"
    ),
}


def model():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(**CONFIG).eval()


def inputs(batch: int = 1, tokens: int = 256, text: int = 64) -> dict:
    g = torch.Generator().manual_seed(1)
    return dict(
        hidden_states=torch.randn(batch, tokens, CONFIG["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, text, CONFIG["joint_attention_dim"], generator=g),
        pooled_projections=torch.randn(batch, CONFIG["pooled_projection_dim"], generator=g),
        timestep=torch.full((batch,), 0.5),
        img_ids=torch.zeros(tokens, 3),
        txt_ids=torch.zeros(text, 3),
        return_dict=False,
    )


def param_bytes(m) -> int:
    from dtp.runtime.memory import local_param_bytes

    return local_param_bytes(m)


def peak_bytes(m, kwargs) -> int:
    """The forward's peak of live tensors on this rank (MemTracker: parameters, buffers, activations, gathers)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(m)
    with tracker, torch.no_grad():
        m(**kwargs)
    return max(stats["Total"] for stats in tracker.get_tracker_snapshot("peak").values())


def timed(m, kwargs, repeats: int) -> float:
    times = []
    with torch.no_grad():
        m(**kwargs)  # warm-up (FSDP2's lazy init, first gathers)
        for _ in range(repeats):
            start = time.perf_counter()
            m(**kwargs)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_job(rank, world, dims) -> dict:
    import dtp
    from dtp.runtime import fsdp as fsdp_runtime
    from dtp.runtime.fsdp import block_lists

    batch = 2 if dims.get("cfg", 1) > 1 else 1
    whole = model()
    blocks = sorted(param_bytes(b) for _, lst in block_lists(whole) for b in lst)[-2:]
    out = dict(whole=param_bytes(whole), blocks=sum(blocks))
    for fsdp in (False, True):
        m = dtp.parallelize(model(), dtp.make_mesh(**dims), fsdp=fsdp)
        out[fsdp] = dict(rest=param_bytes(m), peak=peak_bytes(m, inputs(batch)))
    layout = getattr(fsdp_runtime, "in_flight_bytes", None)  # a tree before sub-block units has none
    out["in_flight"] = None if layout is None else layout(m)
    return out


def alternated(models: dict, kwargs, repeats: int) -> dict:
    """Median wall time per call of each model, the models called in turn (a loaded machine slows them alike);
    `kwargs` one input for all, or a dict of inputs by model name."""
    inputs = kwargs if set(kwargs) == set(models) else dict.fromkeys(models, kwargs)
    times = {name: [] for name in models}
    with torch.no_grad():
        for name, m in models.items():
            m(**inputs[name])  # warm-up (FSDP2's lazy init, first gathers)
        for _ in range(repeats):
            for name, m in models.items():
                start = time.perf_counter()
                m(**inputs[name])
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def speed_job(rank, world, parts=("step", "forward")) -> dict:
    import dtp

    # One core per rank, as each rank has its own accelerator: two ranks of two threads each on the 2-core machine
    # oversubscribe it, and the ranks' waits on each other then swing the ratios by +-40 % from run to run.
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= world:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})  # and its own core

    mesh, out = dtp.make_mesh(cp=2), {}
    for tokens in TOKENS if "step" in parts else ():  # the gathers are the same at every length; the compute grows
        models = {fsdp: dtp.parallelize(model(), mesh, fsdp=fsdp) for fsdp in (False, True)}
        out[tokens] = alternated(models, inputs(tokens=tokens), REPEATS)
    if "forward" in parts:
        models = {"cfg_dtp": dtp.parallelize(model(), dtp.make_mesh(cfg=2)), "cfg_diffusers": model()}
        halves = {"cfg_dtp": inputs(batch=2), "cfg_diffusers": inputs(batch=1)}  # the same half, unsharded
        out.update(alternated(models, halves, FORWARD_REPEATS))
    return out


def memory_section() -> list[str]:
    """Part 1: per-rank bytes at rest, the bound, the forward's peak with and without fsdp, and what the fsdp model's
    unit layout puts in flight (`runtime/fsdp.in_flight_bytes`; absent on a tree before sub-block units)."""
    lines = [f"medium FLUX.1 transformer {CONFIG}, fp32, CPU", ""]
    lines += ["| mesh | whole MB | at rest MB (no fsdp) | at rest MB (fsdp) | bound MB | peak MB (no fsdp) | "
              "peak MB (fsdp) | in flight MB (layout) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for tag, (world, dims) in MESHES.items():
        r = spawn(memory_job, world, dims)[0]
        bound = 1.05 * r["whole"] / world + r["blocks"] / dims.get("tp", 1)
        row = [r["whole"], r[False]["rest"], r[True]["rest"], bound, r[False]["peak"], r[True]["peak"]]
        flight = "n/a" if r["in_flight"] is None else f"{r['in_flight'] / 1e6:.2f}"
        lines.append(f"| {tag} | " + " | ".join(f"{v / 1e6:.2f}" for v in row) + f" | {flight} |")
    return lines


def step_section() -> list[str]:
    """Part 2: the (cp=2) forward with and without fsdp (issue 33's target: <= 1.15x, median of 5)."""
    s = spawn(speed_job, 2, ("step",))[0]
    lines = ["| measure | seconds | ratio | target |", "|---|---|---|---|"]
    for tokens in TOKENS:
        plain, fsdp = s[tokens][False], s[tokens][True]
        lines.append(f"| cp=2 forward, {tokens} tokens, no fsdp | {plain:.4f} | 1.00 | |")
        lines.append(f"| cp=2 forward, {tokens} tokens, fsdp | {fsdp:.4f} | {fsdp / plain:.2f} | <= 1.15 |")
    return lines


def forward_section() -> list[str]:
    """Part 3: tp=1, cfg=2 against diffusers' unsharded forward on the same half (target <= 1.05x)."""
    s = spawn(speed_job, 2, ("forward",))[0]
    ratio = s["cfg_dtp"] / s["cfg_diffusers"]
    return [
        "| measure | seconds | ratio | target |",
        "|---|---|---|---|",
        f"| diffusers forward, batch 1 | {s['cfg_diffusers']:.4f} | 1.00 | |",
        f"| dtp cfg=2 tp=1 forward, batch 2 (1 per rank) | {s['cfg_dtp']:.4f} | {ratio:.2f} | <= 1.05 |",
    ]


SECTIONS = {
    "memory": ("per-rank weights and forward peak (part 1)", memory_section),
    "step": ("cp=2 step time with and without fsdp (part 2)", step_section),
    "forward": ("tp=1 cfg=2 forward against diffusers (part 3)", forward_section),
}


def merged(text: str, fresh: dict[str, list[str]]) -> str:
    """The result file with the sections in `fresh` replaced (or added) and the others kept as they were."""
    kept = {}
    for chunk in text.split("\n## ")[1:]:
        title, _, body = chunk.partition("\n")
        kept[title] = body.strip("\n").split("\n")
    head = ["# fsdp=True on gloo (benchmarks/fsdp.py)", ""]
    for key, (title, _) in SECTIONS.items():
        body = fresh.get(key, kept.get(title))
        head += [f"## {title}", "", *body, ""] if body is not None else []
    return "\n".join(head)


def main(parts: list[str]) -> int:
    fresh = {key: SECTIONS[key][1]() for key in parts}
    RESULT.parent.mkdir(exist_ok=True)
    text = merged(RESULT.read_text() if RESULT.exists() else "", fresh)
    print(text)
    RESULT.write_text(text)
    return 0


def _row(r: dict) -> str:
    mesh = f"cfg={r['cfg']} cp={r['cp']} tp={r['tp']} {r['cp_mode'] or ''}"
    options = f"fsdp={r['fsdp']} text={r['text_encoders']} quant={r['quant']}"
    return f"| {mesh} | {options} | {r['step_seconds']:.4f} | {r['peak_bytes'] / 1e9:.2f} |"


def fit_figures() -> int:
    """Issue 33's fit criteria: FLUX.1's fastest fsdp row against one GPU's peak / 8; Wan's fastest bf16 row. The
    fastest row overall need not use fsdp: `dtp fit` costs FSDP2's gathers and copy-out, so where the whole weights
    fit a mesh without fsdp runs faster (FLUX.1 on 8 x H100 since round 14); the fastest fsdp row is listed too."""
    import dtp

    lines = ["# fsdp in `dtp fit` (benchmarks/fsdp.py --fit)", ""]
    for title, kwargs in FIT_CASES.items():
        rows = [r for r in dtp.fit(**kwargs)["rows"] if r["fits"]]
        with_fsdp = next(r for r in rows if r["fsdp"])
        shown = rows[:4] + ([with_fsdp] if with_fsdp not in rows[:4] else [])
        lines += [f"## {title}", "", "| mesh | options | s/step | peak GB |", "|---|---|---|---|"]
        lines += [_row(r) for r in shown]
        bf16 = next(r for r in rows if r["quant"] is None)
        lines.append(f"\nfastest bf16 / fastest: {bf16['step_seconds'] / rows[0]['step_seconds']:.3f} (target <= 1.02)")
        if kwargs["pipeline"] == "flux-pipeline":
            one = min(
                r["peak_bytes"] for r in dtp.fit(**{**kwargs, "gpus": 1})["rows"] if r["text_encoders"] == "whole"
            )
            ratio = with_fsdp["peak_bytes"] / (one / kwargs["gpus"])
            lines.append(
                f"fastest fsdp row's peak / (one GPU's peak {one / 1e9:.2f} GB / 8): {ratio:.2f} (target <= 1.15)"
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    FIT_RESULT.write_text(text)
    return 0


if __name__ == "__main__":
    chosen = [key for key in SECTIONS if f"--{key}" in sys.argv] or list(SECTIONS)
    sys.exit(fit_figures() if "--fit" in sys.argv else main(chosen))
