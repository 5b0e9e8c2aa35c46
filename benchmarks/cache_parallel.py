"""diffusers' caches on 2 gloo ranks: blocks and attentions each rank runs, and the step time, with and without.

Model: the tiny FLUX.1 pipeline (2 dual + 2 single blocks, 32 x 32, fp32, CPU) with true CFG (two transformer
calls per step), 8 steps. Meshes: one process, tp=2, cp=2 (Ulysses) and cfg=2 on 2 gloo processes, one thread
each. Caches: none, FirstBlockCache (threshold 1.0), TaylorSeer (diffusers' defaults, fp32 factors), PAB (spatial
attention every other call, timesteps 100-800), MagCache (FLUX_MAG_RATIOS, threshold 0.3), FasterCache (two-call
mode). Blocks / attentions are counted inside their bodies (a cache that skips them does not call the class's
forward), per rank; the step time is the median wall time between step ends (steps 1..7). A tiny model's time is
mostly per-call overhead: the counts are what carries over to full-size models. Usage:

    python benchmarks/cache_parallel.py [--steps 8]

Writes benchmarks/results/cache_parallel.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

RESULT = Path(__file__).resolve().parent / "results" / "cache_parallel.md"
CACHES = ("none", "fbc", "taylorseer", "pab", "mag", "faster")
MESHES = {"1 process": None, "tp=2": dict(tp=2), "cp=2": dict(cp=2), "cfg=2": dict(cfg=2)}
CALL = dict(prompt="a cat holding a sign that says hello", negative_prompt="blurry, low quality!", true_cfg_scale=4.0)


def config(name: str, pipe, steps: int):
    import diffusers.hooks as hooks
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    timestep = lambda: pipe.current_timestep  # noqa: E731
    return {
        "none": lambda: None,
        "fbc": lambda: hooks.FirstBlockCacheConfig(threshold=1.0),
        "taylorseer": lambda: hooks.TaylorSeerCacheConfig(taylor_factors_dtype=torch.float32),
        "pab": lambda: hooks.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, current_timestep_callback=timestep
        ),
        "mag": lambda: hooks.MagCacheConfig(mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=steps, threshold=0.3),
        "faster": lambda: hooks.FasterCacheConfig(current_timestep_callback=timestep, is_guidance_distilled=True),
    }[name]()


def count_bodies(counts: Counter) -> None:
    """Patch FLUX.1's block and attention classes to count their real runs into `counts` (for this process)."""
    from diffusers.models.transformers import transformer_flux as flux

    for cls, key in ((flux.FluxTransformerBlock, "blocks"), (flux.FluxSingleTransformerBlock, "blocks")):
        cls.forward = _counting(cls.forward, counts, key)
    flux.FluxAttention.forward = _counting(flux.FluxAttention.forward, counts, "attentions")


def _counting(forward, counts: Counter, key: str):
    def counted(self, *args, **kwargs):
        counts[key] += 1
        return forward(self, *args, **kwargs)

    counted.__wrapped__ = forward  # dtp's CP reads block signatures
    return counted


@torch.no_grad()
def one_run(name: str, dims: dict | None, steps: int, counts: Counter) -> dict:
    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    pipe.set_progress_bar_config(disable=True)
    if dims is not None:
        dtp.parallelize(pipe.transformer, dtp.make_mesh(**dims))
    cache = config(name, pipe, steps)
    if cache is not None:
        try:
            pipe.transformer.enable_cache(cache)
        except dtp.PlanError as error:  # a cache dtp refuses on this mesh: the table says so
            return {"refused": str(error)}
    ends = []

    def mark(pipe, step, timestep, kwargs):
        ends.append(time.perf_counter())
        return kwargs

    counts.clear()
    out = pipe(
        **CALL,
        num_inference_steps=steps,
        height=32,
        width=32,
        output_type="np",
        generator=torch.Generator("cpu").manual_seed(0),
        callback_on_step_end=mark,
    )
    step_s = statistics.median(b - a for a, b in zip(ends, ends[1:]))
    return {
        "blocks": counts["blocks"],
        "attentions": counts["attentions"],
        "step_s": step_s,
        "pixels": np.asarray(out.images, dtype=np.float32),
    }


def rank_job(rank: int, world: int, steps: int) -> dict:
    counts = Counter()
    count_bodies(counts)
    return {
        (mesh, name): one_run(name, dims, steps, counts) for mesh, dims in MESHES.items() if dims for name in CACHES
    }


def table(rows: dict, steps: int) -> str:
    lines = [
        f"tiny FLUX.1, true CFG, {steps} steps, 32 x 32, fp32, CPU (gloo, 1 thread per rank). Per rank: blocks and "
        "attentions run (uncached: 2 calls x 4 per step), median step time; |diff| = mean pixel difference from the "
        "one-process run with the same cache.",
        "",
        "| mesh | cache | blocks (rank 0 / 1) | attentions (rank 0 / 1) | step s (rank 0) | vs no cache | |diff| |",
        "|---|---|---|---|---|---|---|",
    ]
    for (mesh, name), ranks in rows.items():
        if "refused" in ranks[0]:
            lines.append(f"| {mesh} | {name} | refused: {ranks[0]['refused'].split(': ', 1)[1]} | | | | |")
            continue
        base = ranks[0]["step_s"] if name == "none" else rows[(mesh, "none")][0]["step_s"]
        blocks = " / ".join(str(r["blocks"]) for r in ranks)
        attentions = " / ".join(str(r["attentions"]) for r in ranks)
        diff = np.abs(ranks[0]["pixels"] - rows[("1 process", name)][0]["pixels"]).mean()
        lines.append(
            f"| {mesh} | {name} | {blocks} | {attentions} | {ranks[0]['step_s']:.3f} | "
            f"{base / ranks[0]['step_s']:.2f} | {diff:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    from dtp.testing.launch import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    counts = Counter()
    count_bodies(counts)
    rows = {("1 process", name): [one_run(name, None, args.steps, counts)] for name in CACHES}
    ranks = spawn(rank_job, 2, args.steps, timeout_s=1800)
    for key in ranks[0]:
        rows[key] = [ranks[0][key], ranks[1][key]]
    text = table(rows, args.steps)
    print(text)
    RESULT.write_text("# benchmarks/cache_parallel.py\n\n" + text)


if __name__ == "__main__":
    main()
