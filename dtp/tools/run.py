"""`dtp run`: generate one image with a diffusers pipeline whose transformer is sharded by dtp.

Under torchrun every process is one rank of the TP group (tp = world size):

    torchrun --nproc-per-node 4 -m dtp run --model-dir ./FLUX.2-dev --prompt "a cat" --output cat.png

Each rank loads the pipeline's transformer and its text encoders sharded (each rank reads only its
slice of every sharded tensor, and only that slice reaches the accelerator; a text encoder by the
first of its bundled plans that fits, as `dtp.parallelize_pipeline` picks it), shards any other
component that has a plan, keeps the VAE whole, and runs the same denoising loop from the same seeded latents;
the transformer's collectives keep the ranks in lock step, and rank 0 saves the image. Started
without torchrun, `dtp run` runs the unsharded pipeline in one process: the reference.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..adapters import load_lora_weights
from ..cache import apply_cache
from ..errors import PlanError
from ..pipeline import WHOLE, check_pipeline_files, load_pipeline, transformer_class
from ..pipeline.load import transformers_components
from ..policy import default_backend, default_device_type, parse_dtype
from ..quant import config_for
from ..runtime.cfg import CFG_ATTR
from ..runtime.memory import local_param_bytes
from ..runtime.mesh import make_mesh
from ..runtime.placement import local_device
from .watchdog import Progress

DEFAULT_TIMEOUT_S = 600  # torch's own default for gloo is 30 min, NCCL's watchdog 10: one value for both here

LORA_ADAPTER = "lora"  # the adapter name `--lora` loads under


def run(args) -> int:
    """Entry point of `dtp run`: sharded under torchrun (WORLD_SIZE set), else the one-process reference."""
    quiet_libraries()
    transformer_class(args.model_dir)  # a missing or foreign folder: one CheckpointError, before any process group
    if "WORLD_SIZE" not in os.environ:
        device = local_device(default_device_type())
        dtype = _dtype(args.dtype, device)
        check_pipeline_files(args.model_dir, dtype)
        pipe = load_pipeline(args.model_dir, torch_dtype=dtype, device=device, quantization_config=_quant(args))
        add_lora(pipe, args.lora, args.lora_scale, sharded=False)
        add_cache(pipe, args)
        if args.offload_text_encoders:
            offload_text_encoders(pipe)
        _generate_and_save(pipe, args, distributed=False)
        return 0
    device = init_distributed(args.timeout)
    try:
        with rank_progress(min(60.0, args.timeout / 2)) as progress:
            _run_sharded(args, device, progress)
    finally:
        dist.destroy_process_group()
    _exit_now()
    return 0


def _run_sharded(args, device: torch.device, progress: Progress) -> None:
    progress.post("loading the pipeline")
    tp = _tp_degree(dist.get_world_size(), args.cp, args.cfg)
    mesh = make_mesh(tp=tp, cp=args.cp, cfg=args.cfg, device_type=device.type)
    pipe = load_pipeline(
        args.model_dir,
        mesh,
        torch_dtype=_dtype(args.dtype, device),
        plans=_plans(args),
        cp_mode=args.cp_mode,
        pad=args.pad,
        device=device,
        quantization_config=_quant(args),
    )
    add_lora(pipe, args.lora, args.lora_scale, sharded=True)
    add_cache(pipe, args)
    if args.offload_text_encoders:
        offload_text_encoders(pipe)
    pipe.set_progress_bar_config(disable=dist.get_rank() != 0)  # one progress bar, not one per rank
    calls = iter(range(1, sys.maxsize))
    pipe.transformer.register_forward_pre_hook(lambda *_: progress.post(f"transformer call {next(calls)}"))
    _generate_and_save(pipe, args, distributed=True)
    progress.post("finishing")
    dist.barrier()  # tear down together, not while rank 0 still writes the image


def _plans(args) -> dict:
    """`load_pipeline`'s plans from the flags: `--plan` for the transformer, `--whole-text-encoders` (also
    implied by `--offload-text-encoders`: a sharded encoder's DTensors stay on their mesh's device)."""
    plans = {} if args.plan is None else {"transformer": args.plan}
    if args.whole_text_encoders or args.offload_text_encoders:
        plans |= {name: WHOLE for name in transformers_components(args.model_dir)}
    return plans


def _quant(args):
    """The torchao config of `--quant` (None without it)."""
    return None if getattr(args, "quant", None) is None else config_for(args.quant)


def _exit_now() -> None:
    """End a finished rank without interpreter finalization.

    Rarely (once in a full CI run here; not in 24 launches since) a gloo rank aborted after its
    work was done and its group destroyed: "terminate called without an active exception"
    (exit -6), which makes torchrun, and so `dtp demo`, fail. Gloo worker threads that still hold
    tensors crash while the interpreter tears down (pytorch/pytorch#179291 describes it). Every
    output is written and closed by now, so flush the streams and leave without finalizing.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _tp_degree(world_size: int, cp: int, cfg: int = 1) -> int:
    if cp < 1 or cfg < 1 or world_size % (cp * cfg):
        raise PlanError(f"dtp run: --cp {cp} times --cfg {cfg} must divide the number of processes ({world_size}).")
    return world_size // (cp * cfg)


def _generate_and_save(pipe, args, *, distributed: bool) -> None:
    """Generate on every rank; rank 0 saves the image and, if asked, the pixels and every rank's report."""
    pixels, step_s = generate(
        pipe, args.prompt, steps=args.steps, height=args.height, width=args.width, seed=args.seed, **guidance(args)
    )
    reports = [rank_report(pipe, step_s)]
    if distributed:
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, rank_report(pipe, step_s))
        if dist.get_rank() != 0:
            return
    save_image(pixels, args.output)
    if args.save_pixels:
        np.save(args.save_pixels, pixels)
    if args.report:
        Path(args.report).write_text(json.dumps({"ranks": reports}, indent=1))


def guidance(args) -> dict:
    """The guidance options given on the command line, as pipeline keyword arguments (the rest: the pipeline's)."""
    given = dict(
        negative_prompt=args.negative_prompt, true_cfg_scale=args.true_cfg_scale, guidance_scale=args.guidance_scale
    )
    return {name: value for name, value in given.items() if value is not None}


# ---- loading -------------------------------------------------------------------------------------


def add_lora(pipe, lora, scale: float, *, sharded: bool) -> None:
    """The LoRA at `lora` (None: nothing) on the transformer at weight `scale`: dtp's loader when the
    transformer is sharded, diffusers' own for the one-process reference."""
    if lora is None:
        return
    if sharded:
        load_lora_weights(pipe, lora, adapter_name=LORA_ADAPTER)
    else:
        pipe.load_lora_weights(lora, adapter_name=LORA_ADAPTER)
    pipe.transformer.set_adapters(LORA_ADAPTER, weights=scale)


def add_cache(pipe, args) -> None:
    """`--cache NAME [--cache-threshold X]` on the transformer (through dtp.cache when it is sharded)."""
    if getattr(args, "cache", None) is not None:
        apply_cache(pipe, args.cache, getattr(args, "cache_threshold", None), steps=args.steps)


def offload_text_encoders(pipe) -> None:
    """Move every text encoder to the CPU at the transformer's first call (the prompts are encoded by then),
    freeing their accelerator memory for the denoising loop and the decode; a second generation encodes on the CPU.
    """
    encoders = [
        m for n, m in pipe.components.items() if n.startswith("text_encoder") and isinstance(m, torch.nn.Module)
    ]

    def offload(module, args) -> None:
        handle.remove()
        for encoder in encoders:
            encoder.to("cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    handle = pipe.transformer.register_forward_pre_hook(offload)


# ---- generating ------------------------------------------------------------------------------


@torch.no_grad()
def generate(pipe, prompt=None, *, steps=None, height=None, width=None, seed=42, **pipe_kwargs):
    """Run the pipeline once; returns (float pixels H x W x 3 in [0, 1], wall seconds of each step).

    The generator lives on the CPU so every rank, whatever its device, draws the same latents.
    """
    options = {k: v for k, v in dict(num_inference_steps=steps, height=height, width=width).items() if v is not None}
    timer = StepTimer(pipe)
    with timer:
        out = pipe(
            prompt=prompt,
            generator=torch.Generator("cpu").manual_seed(seed),
            output_type="np",
            callback_on_step_end=timer.end_step,
            **options,
            **pipe_kwargs,
        )
    return out.images[0], timer.seconds


class StepTimer:
    """Wall time of each denoising step: from the step's first transformer call to its end-of-step callback."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.seconds: list[float] = []
        self._start = None
        self._cuda = pipe.device.type == "cuda"

    def __enter__(self):
        self._hook = self.pipe.transformer.register_forward_pre_hook(self._begin)
        return self

    def __exit__(self, *exc):
        self._hook.remove()

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _begin(self, module, args):
        if self._start is None:  # classifier-free guidance calls the transformer twice per step
            self._start = self._now()

    def end_step(self, pipe, step, timestep, callback_kwargs):
        self.seconds.append(self._now() - self._start)
        self._start = None
        return callback_kwargs


def rank_report(pipe, step_seconds: list[float]) -> dict:
    """This rank's weight bytes (transformer, text encoders, every module component) and step times."""
    modules = {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}
    return {
        "transformer_bytes": local_param_bytes(pipe.transformer),
        "text_encoder_bytes": sum(local_param_bytes(m) for n, m in modules.items() if n.startswith("text_encoder")),
        "total_bytes": sum(local_param_bytes(m) for m in modules.values()),
        "step_s": statistics.median(step_seconds),
        "steps": len(step_seconds),
        **_cfg_report(pipe.transformer),
    }


def _cfg_report(transformer) -> dict:
    """How the cfg axis ran the transformer's calls (`runtime.cfg.CfgStats`), when it is installed."""
    wrapper = getattr(transformer, CFG_ATTR, None)
    return {} if wrapper is None else {"cfg_calls": dict(vars(wrapper.stats))}


def save_image(pixels: np.ndarray, path) -> None:
    from PIL import Image

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((pixels * 255).round().clip(0, 255).astype(np.uint8)).save(path)


# ---- process setup ---------------------------------------------------------------------------


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S) -> torch.device:
    """Join torchrun's process group (the backend of this rank's device type); returns this rank's device.

    `timeout_s`: how long a collective waits for the other ranks before the group fails it.
    """
    device = local_device(default_device_type())  # cuda:<local rank>, the local Neuron core, or cpu
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(default_backend(device.type), timeout=timedelta(seconds=timeout_s))
    return device


def rank_progress(stall_s: float) -> Progress:
    """This rank's `Progress`, posted to a client of torchrun's rendezvous store (MASTER_ADDR:MASTER_PORT).

    A store of our own next to the process group: it keeps answering while the group is blocked in
    a collective, and the posts live under their own prefix.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=30)
    )
    return Progress(dist.PrefixStore("dtp/progress/", store), dist.get_rank(), dist.get_world_size(), stall_s=stall_s)


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return parse_dtype(name)


def quiet_libraries() -> None:
    """Silence loading bars and info logs of diffusers and transformers (denoising bars stay)."""
    import diffusers
    import transformers

    for lib in (diffusers, transformers):
        lib.utils.logging.set_verbosity_error()
        lib.utils.logging.disable_progress_bar()
    # diffusers 0.42 renamed torch_dtype to dtype; the old name still works and is what older releases take.
    warnings.filterwarnings("ignore", message="`torch_dtype` is deprecated")
