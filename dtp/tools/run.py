"""`dtp run`: generate images or videos with a diffusers pipeline whose components dtp shards.

Under torchrun every process is one rank (tp = world size / (cp x cfg)):

    torchrun --nproc-per-node 4 -m dtp run --model-dir ./FLUX.2-dev --prompt "a cat" --output cat.png
    torchrun --nproc-per-node 2 -m dtp run --model-dir ./Wan2.1-T2V-14B-Diffusers --prompt "a cat" \\
        --height 720 --width 1280 --frames 81 --output cat.mp4
    torchrun --nproc-per-node 2 -m dtp run --model-dir ./wan --prompts batch.jsonl   # loaded once

Each rank loads the pipeline sharded (`dtp.pipeline.session.open_pipeline`), runs the same call from the
same seeded latents (`dtp.pipeline.generate`), and rank 0 writes the output by its suffix (.png, .mp4;
`dtp.pipeline.outputs`). Started without torchrun, `dtp run` runs the whole pipeline in one process: the
reference. This module parses and prints; the work is in the library.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.distributed as dist

from ..errors import PlanError
from ..pipeline import transformer_class
from ..pipeline.generate import rank_report, run_request
from ..pipeline.outputs import check_output, default_output, save
from ..pipeline.parse import LINE_FIELDS, open_image_path, request_from_json
from ..pipeline.request import Request, check_request, makes_video
from ..pipeline.session import LoadOptions, open_pipeline, parse_loras
from ..policy import default_device_type
from ..runtime.launch import exit_now, init_distributed, rank_progress, under_torchrun
from ..runtime.placement import local_device
from .early import pipeline_args  # torch-free, so `early` checks it before the imports; `serve` takes it here


@dataclass(frozen=True)
class Job:
    """One generation of this command: the request (or why its line was refused) and where it goes."""

    where: str  # "" for --prompt, "line N" for --prompts
    request: Request | None
    output: str | None
    error: str | None = None


def run(args) -> int:
    """Entry point of `dtp run`: sharded under torchrun (WORLD_SIZE set), else the one-process reference."""
    quiet_libraries()
    transformer_class(args.model_dir)  # a missing or foreign folder: one CheckpointError, before any process group
    options = load_options(args)
    if not under_torchrun():
        pipe = open_pipeline(options, local_device(default_device_type()), distributed=False)
        return _run_jobs(pipe, args, rank=0, world=1)
    device = init_distributed(args.timeout)
    try:
        with rank_progress(min(60.0, args.timeout / 2)) as progress:
            progress.post("loading the pipeline")
            pipe = open_pipeline(options, device, distributed=True)
            pipe.set_progress_bar_config(disable=dist.get_rank() != 0)  # one progress bar, not one per rank
            calls = iter(range(1, sys.maxsize))
            pipe.transformer.register_forward_pre_hook(lambda *_: progress.post(f"transformer call {next(calls)}"))
            code = _run_jobs(pipe, args, rank=dist.get_rank(), world=dist.get_world_size())
            progress.post("finishing")
            dist.barrier()  # tear down together, not while rank 0 still writes
    finally:
        dist.destroy_process_group()
    exit_now(code)
    return code


def load_options(args) -> LoadOptions:
    """The loading flags `dtp run` and `dtp serve` share (`commands.add_load_options`)."""
    if args.cache_threshold is not None and args.cache is None:
        raise PlanError("--cache-threshold needs --cache NAME.")
    return LoadOptions(
        model_dir=args.model_dir,
        plan=args.plan,
        cp=args.cp,
        cfg=args.cfg,
        cp_mode=args.cp_mode,
        ulysses=args.ulysses,
        allow_cross_node=args.allow_cross_node,
        pad=args.pad,
        dtype=args.dtype,
        quant=args.quant,
        loras=parse_loras(args.lora),
        lora_scale=args.lora_scale,
        whole_text_encoders=args.whole_text_encoders,
        offload_text_encoders=args.offload_text_encoders,
        fsdp=args.fsdp,
        cache=args.cache,
        cache_threshold=args.cache_threshold,
        cache_steps=getattr(args, "steps", None),
        timeout=args.timeout,
        compile=args.compile,
        attention_backend=args.attention_backend,
    )


def _run_jobs(pipe, args, *, rank: int, world: int) -> int:
    """Every job on every rank in the same order; rank 0 writes. A refused line is reported and skipped (the
    same on every rank: the checks are deterministic); a refused --prompt raises. 0 when all ran, else 1."""
    failed = 0
    for job in jobs(args, pipe):
        try:
            if job.error is not None:
                raise PlanError(job.error)
            check_request(pipe, job.request)
            check_output(job.output, makes_video(pipe))
            generation = run_request(pipe, job.request)
        except (PlanError, ValueError) as error:
            if not job.where:
                raise
            failed += 1
            if rank == 0:
                print(f"dtp run: {args.prompts} {job.where}: {error}", file=sys.stderr, flush=True)
            continue
        reports = _gather_reports(rank_report(pipe, generation.step_seconds, generation.compile), world)
        if rank == 0:
            _write(generation, job, args, reports)
    return 1 if failed else 0


def _gather_reports(report: dict, world: int) -> list[dict]:
    if world == 1:
        return [report]
    reports = [None] * world
    dist.all_gather_object(reports, report)
    return reports


def _write(generation, job: Job, args, reports: list[dict]) -> None:
    save(generation.outputs[0], job.output, video=generation.video, fps=job.request.fps)
    for index, extra in enumerate(generation.outputs[1:], start=1):  # n > 1 (a JSONL line's "n" is not taken)
        save(extra, _numbered(job.output, index), video=generation.video, fps=job.request.fps)
    if args.save_pixels:
        np.save(_numbered(args.save_pixels, job.where.rpartition(" ")[2]) if job.where else args.save_pixels,
                generation.outputs[0])  # fmt: skip
    if args.report:
        Path(args.report).write_text(json.dumps({"ranks": reports}, indent=1))
    print(f"dtp run: {job.output} ({len(generation.step_seconds)} steps)", flush=True)


def _numbered(path: str, suffix) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{suffix}{p.suffix}"))


def jobs(args, pipe) -> list[Job]:
    """The generations asked: `--prompt` with the flags, or one per line of `--prompts` (flags as defaults)."""
    video = makes_video(pipe)
    output = args.output or default_output(video)
    base = Request(
        prompt=args.prompt,
        seed=args.seed,
        steps=args.steps,
        height=args.height,
        width=args.width,
        frames=args.frames,
        fps=args.fps,
        image=None if args.image is None else open_image_path(args.image),
        negative_prompt=args.negative_prompt,
        guidance_scale=args.guidance_scale,
        true_cfg_scale=args.true_cfg_scale,
        extra=pipeline_args(args.pipeline_arg),
    )
    if args.prompts is None:
        return [Job("", base, output)]
    return [_line_job(n, line, base, output) for n, line in _lines(args.prompts)]


def _lines(path: str) -> list[tuple[int, str]]:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise PlanError(f"--prompts {path}: cannot read it ({error.strerror}).") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _line_job(number: int, line: str, base: Request, output: str) -> Job:
    where = f"line {number}"
    try:
        body = json.loads(line)
        if isinstance(body, dict) and "prompt" not in body:
            raise PlanError("missing field 'prompt' (a string).")
        request, other = request_from_json(body, LINE_FIELDS, load_image=open_image_path, base=base)
    except json.JSONDecodeError as error:
        return Job(where, None, None, f"not JSON ({error.msg} at column {error.colno}).")
    except PlanError as error:
        return Job(where, None, None, str(error))
    return Job(where, request, other.get("output") or _numbered(output, number))


def quiet_libraries() -> None:
    """Silence loading bars and info logs of diffusers and transformers (denoising bars stay)."""
    import diffusers
    import transformers

    for lib in (diffusers, transformers):
        lib.utils.logging.set_verbosity_error()
        lib.utils.logging.disable_progress_bar()
    # diffusers 0.42 renamed torch_dtype to dtype; the old name still works and is what older releases take.
    warnings.filterwarnings("ignore", message="`torch_dtype` is deprecated")
