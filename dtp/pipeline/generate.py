"""Run a loaded (sharded or whole) pipeline once: the same call on every rank, pixels back as float arrays.

    run_request(pipe, request) -> Generation(outputs, video, step_seconds)
        outputs: one float32 array in [0, 1] per output, H x W x 3 for an image, F x H x W x 3 for a video

The pipeline's own output decides images vs frames (`.frames` for video pipelines, `.images` otherwise).
The generator lives on the CPU so every rank, whatever its device, draws the same latents; the
transformer's collectives then keep the ranks in lock step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..runtime.cfg import CFG_ATTR, check_predictions
from ..runtime.compile import CompileWatch, is_compiled
from ..runtime.memory import local_param_bytes
from .request import Request, call_parameters, check_request, pipe_kwargs


@dataclass(frozen=True)
class Generation:
    outputs: list  # float32 arrays in [0, 1]: H x W x 3 (image) or F x H x W x 3 (video)
    video: bool
    step_seconds: list
    compile: dict | None = None  # a compiled transformer's CompileWatch report (graphs, recompiles, graph_breaks)


@torch.no_grad()
def run_request(pipe, request: Request, *, on_step=None) -> Generation:
    """Check `request` against `pipe` (PlanError before anything runs), then generate; `on_step(n)` after
    each denoising step (a server's progress)."""
    check_request(pipe, request)
    if request.lora is not None:
        pipe.transformer.set_adapters(list(request.lora), weights=list(request.lora.values()))
    watch = CompileWatch() if is_compiled(pipe.transformer) else None
    timer = StepTimer(pipe, on_step=on_step if watch is None else _chain(watch.step_ended, on_step))
    with timer:
        out = pipe(
            prompt=request.prompt,
            generator=torch.Generator("cpu").manual_seed(request.seed),
            output_type="np",
            **timer.call_kwargs(),
            **pipe_kwargs(pipe, request),
        )
    check_predictions(getattr(pipe, "transformer", None))  # the cfg step path: one read per generation
    outputs, video = pixels_of(out)
    report = None if watch is None else watch.report()
    return Generation(outputs=outputs, video=video, step_seconds=timer.seconds, compile=report)


def _chain(first, then):
    """A step callback calling `first()` and then `then(n)` (when given)."""

    def call(n: int) -> None:
        first()
        if then is not None:
            then(n)

    return call


def pixels_of(out) -> tuple[list, bool]:
    """(one float32 array per output, is a video) of a pipeline output called with output_type="np"."""
    if hasattr(out, "frames"):
        return [np.asarray(video, dtype=np.float32) for video in out.frames], True
    return [np.asarray(image, dtype=np.float32) for image in out.images], False


def generate(pipe, prompt=None, *, steps=None, height=None, width=None, seed=42, frames=None, image=None, **extra):
    """One generation; returns (the first output's float pixels, wall seconds of each step).

    The short form of `run_request` that tests and benchmarks call: guidance options and any other
    `__call__` argument go in `extra` (negative_prompt, guidance_scale and true_cfg_scale by name).
    """
    named = {k: extra.pop(k) for k in ("negative_prompt", "guidance_scale", "true_cfg_scale") if k in extra}
    request = Request(
        prompt=prompt,
        seed=seed,
        steps=steps,
        height=height,
        width=width,
        frames=frames,
        image=image,
        extra=extra,
        **named,
    )
    generation = run_request(pipe, request)
    return generation.outputs[0], generation.step_seconds


class StepTimer:
    """Time of each denoising step: from the step's first transformer call to its end-of-step callback.

    On CUDA each mark is an event recorded on the current stream (no host sync inside the generation: a
    `torch.cuda.synchronize` per step would drain the launch queue and rule out CUDA graphs); the events are read
    once, after the generation (`seconds` is filled on exit). Elsewhere the marks are host clock readings.
    `on_step(n)` is called after step n's callback (a server's progress), without waiting for the device.
    """

    def __init__(self, pipe, on_step=None):
        self.pipe = pipe
        self.on_step = on_step
        self.seconds: list[float] = []
        self.steps = 0
        self._marks: list[tuple] = []  # (start, end) of each step
        self._start = None
        self._cuda = pipe.device.type == "cuda"
        self._callback = True

    def call_kwargs(self) -> dict:
        """The pipeline's step callback when its `__call__` takes one; {} when it does not (HunyuanVideo 1.5):
        then a step ends at the scheduler's `step` (`__enter__` wraps it)."""
        return {"callback_on_step_end": self.end_step} if self._callback else {}

    def __enter__(self):
        self._hook = self.pipe.transformer.register_forward_pre_hook(self._begin)
        # A pipeline without a scheduler (a test's stand-in) is driven through `end_step` by its caller.
        self._callback = not hasattr(self.pipe, "scheduler") or "callback_on_step_end" in call_parameters(self.pipe)
        if not self._callback:
            scheduler, step = self.pipe.scheduler, self.pipe.scheduler.step

            def timed_step(*args, **kwargs):
                result = step(*args, **kwargs)
                self.end_step(self.pipe, self.steps, None, {})
                return result

            scheduler.step = timed_step  # an instance attribute over the class's method, removed on exit
        return self

    def __exit__(self, *exc):
        self._hook.remove()
        if not self._callback:
            del self.pipe.scheduler.step
        self.seconds = [_elapsed(start, end) for start, end in self._marks]

    def _mark(self):
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _begin(self, module, args):
        if self._start is None:  # classifier-free guidance calls the transformer twice per step
            self._start = self._mark()

    def end_step(self, pipe, step, timestep, callback_kwargs):
        self._marks.append((self._start, self._mark()))
        self._start = None
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self.steps)
        return callback_kwargs


def _elapsed(start, end) -> float:
    """Seconds between two marks: host clock readings, or CUDA events (waits for the end event once)."""
    if isinstance(start, float):
        return end - start
    end.synchronize()
    return start.elapsed_time(end) / 1000


def rank_report(pipe, step_seconds: list[float], compile_stats: dict | None = None) -> dict:
    """This rank's weight bytes (transformer, text encoders, every module component) and step times; with a
    compiled transformer, what dynamo compiled (`Generation.compile`)."""
    modules = {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}
    return {
        "transformer_bytes": local_param_bytes(pipe.transformer),
        "text_encoder_bytes": sum(local_param_bytes(m) for n, m in modules.items() if n.startswith("text_encoder")),
        "total_bytes": sum(local_param_bytes(m) for m in modules.values()),
        "step_s": statistics.median(step_seconds),
        "steps": len(step_seconds),
        **_cfg_report(pipe.transformer),
        **({} if compile_stats is None else {"compile": compile_stats}),
    }


def _cfg_report(transformer) -> dict:
    """How the cfg axis ran the transformer's calls (`runtime.cfg.CfgStats`), when it is installed."""
    wrapper = getattr(transformer, CFG_ATTR, None)
    return {} if wrapper is None else {"cfg_calls": dict(vars(wrapper.stats))}


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
