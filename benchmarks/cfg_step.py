"""One denoising step with classifier-free guidance: cfg=2 (2 processes) vs one process, 1 thread each.

Model: the Qwen-Image architecture at a width where compute dominates (8 heads x 64 = 512, 4 blocks),
1024 image tokens (a 64 x 64 latent, 2 x 2 patches) and 64 text tokens, fp32 on CPU. A step is what the
pipelines do:
- two calls ("pair", as Qwen-Image with true_cfg_scale, Wan, ...): transformer(cond), transformer(uncond),
  combine, update the latents;
- one call on a doubled batch ("batch", as SD3, PixArt-Sigma, ...): transformer(cat([uncond, cond])).
cfg=2 runs the same loop on 2 gloo processes with `dtp.parallelize(model, make_mesh(cfg=2))`: the pair
path after the first (learning) step, the batch path always. Times are medians over the timed steps
(step 0 and one warm-up step excluded). A second, untimed run of 4 steps counts the host reads of
steps 2.. (`dtp.testing.syncs.StepSyncs`: scalar reads, torch.equal, .tolist(), tensors from Python data,
torch.cuda.synchronize; on a GPU each one waits for every queued kernel). Usage:

    python benchmarks/cfg_step.py [--steps 6] [--img-tokens 1024] [--layers 4]

Writes benchmarks/results/cfg_step.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

import dtp
from dtp.testing.launch import spawn
from dtp.testing.syncs import StepSyncs
from dtp.testing.tiny import TINY_CONFIGS, tiny_inputs, tiny_model

CLS = "QwenImageTransformer2DModel"
WIDTH = dict(num_attention_heads=8, attention_head_dim=64, joint_attention_dim=256, axes_dims_rope=(16, 24, 24))
RESULT = Path(__file__).resolve().parent / "results" / "cfg_step.md"


def config(layers: int) -> dict:
    return {**TINY_CONFIGS[CLS], **WIDTH, "num_layers": layers}


@torch.no_grad()
def run_steps(model, inputs: dict, mode: str, steps: int, syncs: StepSyncs | None = None) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each denoising step; the latents move every step, as a scheduler moves them."""
    uncond = {**inputs, "encoder_hidden_states": inputs["encoder_hidden_states"].flip(1)}
    latents, seconds = inputs["hidden_states"], []
    for _ in range(steps):
        start, cpu = time.perf_counter(), time.process_time()
        if mode == "pair":
            cond_out = model(**{**inputs, "hidden_states": latents})[0]
            uncond_out = model(**{**uncond, "hidden_states": latents})[0]
        else:
            doubled = {k: torch.cat([uncond[k], inputs[k]]) for k in ("encoder_hidden_states", "timestep")}
            doubled["encoder_hidden_states_mask"] = torch.cat([inputs["encoder_hidden_states_mask"]] * 2)
            doubled["hidden_states"] = torch.cat([latents] * 2)
            out = model(**{**inputs, **doubled, "img_shapes": inputs["img_shapes"] * 2})[0]
            uncond_out, cond_out = out.chunk(2)
        latents = latents - 0.01 * (uncond_out + 4.0 * (cond_out - uncond_out))
        seconds.append((time.perf_counter() - start, time.process_time() - cpu))
        if syncs is not None:
            syncs.end_step(None, len(seconds) - 1, None, {})
    return seconds


def job(rank: int, world: int, layers: int, img_tokens: int, steps: int) -> dict:
    cfg = config(layers)
    model = tiny_model(CLS, **WIDTH, num_layers=layers)
    if world > 1:
        dtp.parallelize(model, dtp.make_mesh(cfg=world))
    inputs = tiny_inputs(CLS, config=cfg, img_tokens=img_tokens, txt_tokens=64)
    inputs.pop("txt_seq_lens", None)
    out = {}
    for mode in ("pair", "batch"):
        seconds = run_steps(model, inputs, mode, steps)[2:]
        out[mode] = statistics.median(wall for wall, _ in seconds)
        out[f"{mode}_cpu"] = statistics.median(cpu for _, cpu in seconds)
        with StepSyncs(first=2) as syncs:
            run_steps(model, inputs, mode, min(steps, 4), syncs)
        out[f"{mode}_reads"] = sum(syncs.per_step().values())
    out["threads"] = torch.get_num_threads()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--img-tokens", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    one = spawn(job, 1, args.layers, args.img_tokens, args.steps)[0]
    two = spawn(job, 2, args.layers, args.img_tokens, args.steps)
    rows = [
        "| step | 1 process wall (s) | cfg=2 wall (s) | ratio "
        "| 1 process CPU (s) | cfg=2 CPU, busiest rank (s) | ratio | host reads / step, 1 process | cfg=2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, label in (("pair", "two calls (Qwen-Image true cfg, Wan)"), ("batch", "doubled batch (SD3, PixArt)")):
        wall, cpu = max(r[mode] for r in two), max(r[f"{mode}_cpu"] for r in two)
        rows.append(
            f"| {label} | {one[mode]:.3f} | {wall:.3f} | {wall / one[mode]:.2f}x "
            f"| {one[f'{mode}_cpu']:.3f} | {cpu:.3f} | {cpu / one[f'{mode}_cpu']:.2f}x "
            f"| {one[f'{mode}_reads']:g} | {max(r[f'{mode}_reads'] for r in two):g} |"
        )
    params = sum(p.numel() for p in tiny_model(CLS, **WIDTH, num_layers=args.layers).parameters())
    text = (
        f"# One denoising step at cfg=2 vs one process\n\n"
        f"`python benchmarks/cfg_step.py --steps {args.steps} --img-tokens {args.img_tokens} --layers {args.layers}`: "
        f"{CLS}, {params / 1e6:.1f} M parameters (8 heads x 64, {args.layers} blocks), {args.img_tokens} image + 64 "
        f"text tokens, fp32, 1 thread per process ({os.cpu_count()} cores; median of steps 2..{args.steps - 1}).\n\n"
        + "\n".join(rows)
        + f"\n\nLoad average while it ran: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (CPU seconds are this "
        "process's own, so they stay meaningful when other work shares the cores; wall seconds do not). Host reads: "
        "per step of steps 2.., summed over the kinds `dtp.testing.syncs` counts, the busiest rank.\n"
    )
    print(text)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text)


if __name__ == "__main__":
    main()
