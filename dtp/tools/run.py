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
from ..errors import PlanError
from ..loading import build_skeleton, from_pretrained, is_transformers_class, load_prepared
from ..pipeline import parallelize_pipeline, prepare_component
from ..plan import load_plan
from ..policy import CP_MODES, DTYPES, default_backend, default_device_type, parse_dtype
from ..runtime.cfg import CFG_ATTR
from ..runtime.memory import local_param_bytes
from ..runtime.mesh import make_mesh
from ..runtime.placement import local_device
from .watchdog import Progress

DEFAULT_TIMEOUT_S = 600  # torch's own default for gloo is 30 min, NCCL's watchdog 10: one value for both here

LORA_ADAPTER = "lora"  # the adapter name `--lora` loads under


def register(sub) -> None:
    p = sub.add_parser("run", help="generate an image with a sharded pipeline (launch with torchrun)")
    p.add_argument("--model-dir", required=True, help="a diffusers pipeline directory (model_index.json)")
    p.add_argument(
        "--plan",
        default=None,
        help="bundled plan name or YAML path (default: the model's bundled plan); used under torchrun",
    )
    p.add_argument(
        "--cp", type=int, default=1, help="context-parallel degree under torchrun: tp = world size / cp (default 1)"
    )
    p.add_argument(
        "--cfg",
        type=int,
        default=1,
        help="cfg groups under torchrun: the guidance branches (or the batch) of each step on different groups of "
        "tp * cp ranks; tp = world size / (cfg * cp) (default 1)",
    )
    p.add_argument("--negative-prompt", default=None, help="the guidance's negative prompt (default: the pipeline's)")
    p.add_argument(
        "--true-cfg-scale", type=float, default=None, help="Qwen-Image / FLUX.1 true CFG scale (with --negative-prompt)"
    )
    p.add_argument("--guidance-scale", type=float, default=None, help="the pipeline's guidance_scale (default its own)")
    p.add_argument("--cp-mode", choices=CP_MODES, default="ulysses", help="CP attention (default ulysses)")
    p.add_argument("--pad", action="store_true", help="zero-pad heads and widths tp does not divide (exact)")
    p.add_argument(
        "--whole-text-encoders",
        action="store_true",
        help="under torchrun, keep the text encoders whole on every rank (default: sharded by their plans, each "
        "rank reading only its slice)",
    )
    p.add_argument("--prompt", required=True)
    p.add_argument("--lora", default=None, help="a diffusers LoRA file or folder for the transformer (default: none)")
    p.add_argument("--lora-scale", type=float, default=1.0, help="the LoRA's adapter weight (default 1.0)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the pipeline's)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--seed", type=int, default=42, help="latents seed, the same on every rank (default 42)")
    p.add_argument(
        "--dtype", choices=["auto", *DTYPES], default="auto", help="auto: bfloat16 on accelerators, float32 on CPU"
    )
    p.add_argument("--output", default="output.png", help="image path, written by rank 0 (default output.png)")
    p.add_argument("--report", default=None, help="also write per-rank weight bytes and step times as JSON (rank 0)")
    p.add_argument("--save-pixels", default=None, help="also save the float [0, 1] pixels as .npy (rank 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a collective may wait for the other ranks before the process group fails (default 600); "
        "a rank that waits min(60, timeout / 2) s names the ranks behind it",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Entry point of `dtp run`: sharded under torchrun (WORLD_SIZE set), else the one-process reference."""
    quiet_libraries()
    if "WORLD_SIZE" not in os.environ:
        device = local_device(default_device_type())
        pipe = load_pipeline(args.model_dir, device=device, dtype=_dtype(args.dtype, device))
        add_lora(pipe, args.lora, args.lora_scale, sharded=False)
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
        device=device,
        dtype=_dtype(args.dtype, device),
        mesh=mesh,
        plan=args.plan,
        cp_mode=args.cp_mode,
        pad=args.pad,
        text_encoders=not args.whole_text_encoders,
    )
    add_lora(pipe, args.lora, args.lora_scale, sharded=True)
    pipe.set_progress_bar_config(disable=dist.get_rank() != 0)  # one progress bar, not one per rank
    calls = iter(range(1, sys.maxsize))
    pipe.transformer.register_forward_pre_hook(lambda *_: progress.post(f"transformer call {next(calls)}"))
    _generate_and_save(pipe, args, distributed=True)
    progress.post("finishing")
    dist.barrier()  # tear down together, not while rank 0 still writes the image


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


# ---- loading ---------------------------------------------------------------------------------


def load_pipeline(model_dir, *, device, dtype, mesh=None, plan=None, cp_mode="ulysses", pad=False, text_encoders=True):
    """The pipeline in `model_dir` on `device`; with a `mesh`, its transformer sharded by `plan`, its text
    encoders by their bundled plans (unless `text_encoders` is False: then they stay whole on every rank),
    and every other component that has a plan (`dtp.parallelize_pipeline`); `pad` goes to all of them.

    The transformer and the text encoders are loaded shard-on-load (`dtp.from_pretrained`) and handed
    to diffusers, so no rank ever holds one of them whole; the rest is loaded by diffusers.
    """
    from diffusers import DiffusionPipeline

    loaded = {}
    if mesh is None:
        loaded["transformer"] = transformer_class(model_dir).from_pretrained(
            model_dir, subfolder="transformer", torch_dtype=dtype
        )
    else:
        # The text encoders are checked first (meta skeletons, no byte read): a plan that does not fit one
        # stops every rank before the transformer is read.
        encoders = prepare_text_encoders(model_dir, mesh, dtype, device, cp_mode, pad) if text_encoders else {}
        loaded["transformer"] = load_sharded_transformer(model_dir, mesh, plan, dtype, device, cp_mode, pad)
        loaded |= load_text_encoders(model_dir, encoders, dtype)
    pipe = DiffusionPipeline.from_pretrained(model_dir, **loaded, torch_dtype=dtype)
    if mesh is not None and text_encoders:
        parallelize_pipeline(pipe, mesh, exclude=tuple(loaded), cp_mode=cp_mode, device=device, pad=pad)
    return pipe.to(device)  # moves the replicated components; the sharded ones are already there


def prepare_text_encoders(model_dir, mesh, dtype, device, cp_mode="ulysses", pad=False) -> dict:
    """`{name: (skeleton, Prepared)}` for every transformers component of the pipeline that has a plan (its
    text encoders): built on meta from `<model_dir>/<name>/config.json` and checked on the mesh's `tp` axis
    (`prepare_component`: the first of its bundled plans that fits). Nothing is read; a component without
    a plan is left out (diffusers loads it whole)."""
    prepared = {}
    for name, cls in transformers_components(model_dir).items():
        model = build_skeleton(cls, os.path.join(model_dir, name), dtype)
        ready = prepare_component(name, model, mesh, cp_mode=cp_mode, device=device, pad=pad)
        if ready is not None:
            prepared[name] = (model, ready)
    return prepared


def load_text_encoders(model_dir, prepared: dict, dtype) -> dict:
    """`{name: model}`: each prepared text encoder filled shard-on-load from `<model_dir>/<name>/` (this rank
    reads only its slice of every sharded tensor)."""
    for name, (model, ready) in prepared.items():
        load_prepared(model, ready, os.path.join(model_dir, name), dtype)
    return {name: model for name, (model, _) in prepared.items()}


def transformers_components(model_dir) -> dict:
    """`{name: class}` of the pipeline's transformers model components (text encoders; not tokenizers)."""
    import transformers

    index = json.loads((Path(model_dir) / "model_index.json").read_text())
    found = {}
    for name, entry in index.items():
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == "transformers" and entry[1]:
            cls = getattr(transformers, entry[1], None)
            if is_transformers_class(cls):
                found[name] = cls
    return found


def load_sharded_transformer(model_dir, mesh, plan, dtype, device, cp_mode="ulysses", pad=False):
    """The pipeline's transformer, sharded with `plan` (name, path, Plan or None = bundled) on `mesh`
    (TP on its `tp` axis; the plan's context parallelism in `cp_mode` when its `cp` axis is > 1;
    `pad=True` zero-pads heads and widths tp does not divide).

    Shard-on-load: each rank reads only its own slice of every sharded tensor from the safetensors
    files and moves only that slice to `device` (no full copy of the transformer on any rank).
    """
    plan = load_plan(plan) if isinstance(plan, (str, Path)) else plan
    return from_pretrained(
        transformer_class(model_dir),
        model_dir,
        mesh,
        plan,
        subfolder="transformer",
        torch_dtype=dtype,
        device=device,
        cp_mode=cp_mode,
        pad=pad,
    )


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


def transformer_class(model_dir):
    """The diffusers class of the pipeline's transformer, as named in model_index.json."""
    import diffusers

    index_path = Path(model_dir) / "model_index.json"
    if not index_path.exists():
        raise FileNotFoundError(f"{model_dir} is not a diffusers pipeline directory: {index_path} is missing.")
    entry = json.loads(index_path.read_text()).get("transformer")
    if not entry or entry[1] is None:
        raise ValueError(f"{index_path} names no transformer component; dtp shards a pipeline's transformer.")
    return getattr(diffusers, entry[1])


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
