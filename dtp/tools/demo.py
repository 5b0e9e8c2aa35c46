"""`dtp demo`: a tiny random-weight FLUX.1 (or Qwen-Image) pipeline generates one image sharded over N processes and
once on one process; the two images must match.

Steps: create the tiny pipeline checkpoint on first use (dtp.pipeline), launch `dtp run` on N local
processes with torch's launcher (torch.distributed.run: NCCL with one GPU per rank, else gloo on CPU), run
`dtp run` again without the launcher (one process, unsharded: the reference), then print a table of
per-rank weight bytes (transformer, text encoders, total) and wall time per step, and the pixel
difference. Exits 1 when the images differ beyond the tolerance.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..errors import PlanError
from ..families.pipelines import DEMO_PROMPT, tiny_checkpoint
from ..parallelize import tp_candidates
from ..pipeline import transformer_class
from ..pipeline.compare import MEAN_TOLERANCE, P99_TOLERANCE, compare
from ..plan import load_plan
from ..policy import check_degree, default_backend, default_device_type
from .run import quiet_libraries

PROMPT = DEMO_PROMPT
NEGATIVE_PROMPT = "blurry, low quality"  # with --cfg > 1: true CFG (two transformer calls per step)
_TITLES = {"flux": "FLUX.1", "qwenimage": "Qwen-Image"}


def run(args) -> int:
    _check_args(args)
    args.plan = args.plan or args.model  # the bundled plans are named like the tiny pipelines
    quiet_libraries()
    model_dir = tiny_checkpoint(args.model)
    print(f"checkpoint: {model_dir}", flush=True)
    what = f"--nproc {args.nproc}" if args.cfg == 1 else f"tp {args.nproc // args.cfg} (--nproc / --cfg)"
    _check_tp(model_dir, args.plan, args.nproc // args.cfg, args.pad, what)
    with tempfile.TemporaryDirectory(prefix="dtp-demo-") as tmp:
        work = Path(tmp)
        sharded = _generate(model_dir, args, work / "tp", nproc=args.nproc, output=args.output)
        single = _generate(model_dir, args, work / "ref", nproc=None, output=work / "ref.png")
    mean, p99, ok = compare(sharded["pixels"], single["pixels"])
    print(_table(args, sharded, single, mean, p99, ok))
    return 0 if ok else 1


def _check_args(args) -> None:
    for name in ("nproc", "cfg", "steps", "size"):
        try:
            check_degree(getattr(args, name), f"dtp demo: --{name}")
        except PlanError as exc:
            raise SystemExit(str(exc)) from None
    if args.nproc % args.cfg:
        raise SystemExit(f"dtp demo: --cfg {args.cfg} does not divide --nproc {args.nproc}.")
    if args.size % 4:
        # FLUX and Qwen-Image pack 2 x 2 latent patches and the tiny VAEs halve the resolution once.
        raise SystemExit(f"dtp demo: --size {args.size} is not a multiple of 4; try {args.size + 4 - args.size % 4}.")


def _check_tp(model_dir: Path, plan_name: str, tp: int, pad: bool = False, what: str | None = None) -> None:
    """Refuse a TP degree the plan cannot take before launching anything (a meta-device model, no weights)."""
    cls = transformer_class(model_dir)
    with torch.device("meta"):
        model = cls.from_config(cls.load_config(model_dir, subfolder="transformer"))
    plan = load_plan(plan_name)
    supported = tp_candidates(model, plan, pad=pad)
    if tp not in supported:
        padded = "" if pad else f"; with --pad: {', '.join(map(str, tp_candidates(model, plan, pad=True)))}"
        raise SystemExit(
            f"dtp demo: {what or f'--nproc {tp}'} is not a TP degree plan '{plan_name}' supports for this model; "
            f"supported: {', '.join(map(str, supported))}{padded}."
        )


def _generate(model_dir: Path, args, prefix: Path, *, nproc: int | None, output) -> dict:
    """One `dtp run` in subprocesses: under torch's launcher with `nproc` ranks, or plain (nproc None)."""
    command = [
        "-m",
        "dtp",
        "run",
        "--model-dir",
        str(model_dir),
        "--prompt",
        PROMPT,
        "--steps",
        str(args.steps),
        "--height",
        str(args.size),
        "--width",
        str(args.size),
        "--seed",
        str(args.seed),
        "--dtype",
        "float32",
        "--output",
        str(output),
        "--report",
        f"{prefix}.json",
        "--save-pixels",
        f"{prefix}.npy",
        *(["--negative-prompt", NEGATIVE_PROMPT, "--true-cfg-scale", "4"] if args.cfg > 1 else []),
    ]
    if nproc is not None:
        command = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            *command,
            "--plan",
            args.plan,
            *(["--pad"] if args.pad else []),
            *(["--cfg", str(args.cfg)] if args.cfg > 1 else []),
        ]
    # One thread per rank: N processes on a few cores would otherwise oversubscribe them.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if not _use_gpus(args.nproc):
        env["CUDA_VISIBLE_DEVICES"] = ""  # both runs on CPU with gloo rather than ranks without a GPU
    print("$ python " + shlex.join(command), flush=True)
    done = subprocess.run([sys.executable, *command], env=env)
    if done.returncode != 0:
        raise SystemExit(f"dtp demo: the run above failed with exit code {done.returncode}.")
    return {"pixels": np.load(f"{prefix}.npy"), "ranks": json.loads(Path(f"{prefix}.json").read_text())["ranks"]}


def _table(args, sharded: dict, single: dict, mean: float, p99: float, ok: bool) -> str:
    ref = single["ranks"][0]
    name = f"tp={args.nproc // args.cfg}" + (f",cfg={args.cfg}" if args.cfg > 1 else "")
    rows = [(name, str(r), rank) for r, rank in enumerate(sharded["ranks"])]
    rows.append(("1 process", "-", ref))
    lines = [
        "",
        f"dtp demo: tiny random-weight {_TITLES[args.model]} pipeline, plan '{args.plan}'",
        f"{args.size}x{args.size} pixels, {args.steps} steps, seed {args.seed}, fp32, "
        f"{name}{' (pad=True)' if args.pad else ''} ({_backend(args.nproc)}) vs 1 process; "
        f"image: {args.output}",
        "",
        f"| {'run':<9} | {'rank':>4} | {'transformer bytes':>17} | {'text encoder bytes':>18} | {'total bytes':>11} "
        f"| {'share of 1 process':>18} | {'ms / step':>9} |",
        f"|{'-' * 11}|{'-' * 5}:|{'-' * 18}:|{'-' * 19}:|{'-' * 12}:|{'-' * 19}:|{'-' * 10}:|",
    ]
    for run_name, rank, r in rows:
        share = r["total_bytes"] / ref["total_bytes"]  # every weight of the pipeline (the VAE stays whole)
        lines.append(
            f"| {run_name:<9} | {rank:>4} | {r['transformer_bytes']:>17,} | {r['text_encoder_bytes']:>18,} "
            f"| {r['total_bytes']:>11,} | {share:>18.3f} | {1e3 * r['step_s']:>9.1f} |"
        )
    calls = sharded["ranks"][0].get("cfg_calls")
    if calls:
        lines += [
            "",
            f"cfg: rank 0's transformer calls: {calls['hits']} answered by the other group's branch, "
            f"{calls['batch']} batches split, {calls['whole']} run whole (learning the pair)",
        ]
    lines += [
        "",
        f"pixels in [0, 1]: mean |{name} - 1 process| = {mean:.2e} (tolerance {MEAN_TOLERANCE:.0e}), "
        f"p99 = {p99:.2e} (tolerance {P99_TOLERANCE:.0e}): {'OK' if ok else 'MISMATCH'}",
    ]
    return "\n".join(lines)


def _use_gpus(nproc: int) -> bool:
    """One GPU per rank, or none: with fewer GPUs than ranks the demo runs on CPU."""
    return default_device_type() == "cuda" and torch.cuda.device_count() >= nproc


def _backend(nproc: int) -> str:
    return default_backend("cuda" if _use_gpus(nproc) else "cpu")
