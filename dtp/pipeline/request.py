"""One generation asked of a loaded pipeline: a `Request`, parsed from the command line, a JSONL line or an
HTTP body, and checked against the pipeline before any rank starts.

The pipeline decides what it takes, not a list of class names: a request's frames need a `num_frames`
argument in the pipeline's `__call__`, its image an `image` argument; sizes must be multiples of what the
VAE and the transformer's patch divide (`size_multiple`), frames of the VAE's time factor (`4k + 1` for Wan).
Every refusal is a `PlanError` naming the field, the value and what would work.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields

from ..errors import PlanError
from ..policy import is_int

DEFAULT_SEED = 42
DEFAULT_FPS = 16  # Wan 2.1's frame rate


@dataclass(frozen=True, kw_only=True)
class Request:
    """What to generate; None leaves the pipeline's own default."""

    prompt: str
    seed: int = DEFAULT_SEED  # drawn by a CPU generator: the same latents on every rank and device
    steps: int | None = None  # num_inference_steps
    height: int | None = None
    width: int | None = None
    frames: int | None = None  # num_frames, video pipelines only
    fps: int = DEFAULT_FPS  # the mp4's frame rate (not a pipeline argument)
    image: object = None  # a PIL image: the pipeline's `image` argument (I2V, edit, Kontext, FLUX.2 reference)
    negative_prompt: str | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None
    n: int = 1  # outputs per prompt
    lora: dict | None = None  # {adapter name: weight}, as `set_adapters` takes them; None: as loaded
    extra: dict = field(default_factory=dict)  # further `__call__` keyword arguments, passed as given


def call_parameters(pipe) -> set[str]:
    """The keyword arguments the pipeline's `__call__` names."""
    return set(inspect.signature(type(pipe).__call__).parameters)


def makes_video(pipe) -> bool:
    """A pipeline that takes a frame count returns frames (`.frames`), one that does not returns `.images`."""
    return "num_frames" in call_parameters(pipe)


def size_multiple(pipe) -> int:
    """Height and width must be multiples of this: the VAE's spatial factor times the transformer's spatial patch
    (Wan 8 x 2 = 16, Qwen-Image 8 x 2 = 16, LTX-Video 32 x 1 = 32). FLUX.1/.2 declare a patch of 1 and pack 2 x 2
    latents themselves: for them 8, and the pipeline rounds a size to 16 with a warning, as diffusers does."""
    vae = getattr(pipe, "vae_scale_factor_spatial", None) or getattr(pipe, "vae_scale_factor", None) or 8
    config = getattr(getattr(pipe, "transformer", None), "config", None)
    patch = getattr(config, "patch_size", None) or 1
    patch = patch[-1] if isinstance(patch, (tuple, list)) else patch
    return int(vae) * int(patch)


def frame_step(pipe) -> int:
    """Frames must be `k * frame_step + 1`: the VAE's time factor (4 for Wan: 81 frames = 21 latent frames)."""
    return int(getattr(pipe, "vae_scale_factor_temporal", 1) or 1)


def check_request(pipe, request: Request) -> None:
    """PlanError for anything `pipe` cannot take, before a rank generates (every rank would fail alike)."""
    taken = call_parameters(pipe)
    _check_counts(request)
    for name, value in (("height", request.height), ("width", request.width)):
        multiple = size_multiple(pipe)
        if value is not None and value % multiple:
            raise PlanError(
                f"{name} {value} is not a multiple of {multiple} (the VAE's factor x the transformer's patch); "
                f"try {value - value % multiple or multiple}."
            )
    if request.frames is not None:
        if "num_frames" not in taken:
            raise PlanError(f"frames: {type(pipe).__name__} makes images; it takes no frame count.")
        step = frame_step(pipe)
        if (request.frames - 1) % step:
            raise PlanError(f"frames {request.frames} is not {step}k + 1 (the VAE's time factor is {step}).")
    if request.image is not None and "image" not in taken:
        raise PlanError(f"image: {type(pipe).__name__} takes no image argument (a text-to-image/video pipeline).")
    if "image" in taken and request.image is None and _image_required(pipe):
        raise PlanError(f"image: {type(pipe).__name__} needs an input image (--image PATH, or 'image' in a request).")
    _check_guidance(taken, request, type(pipe).__name__)
    unknown = sorted(set(request.extra) - taken)
    if unknown:
        raise PlanError(f"{type(pipe).__name__} takes no argument {', '.join(unknown)}.")


def _check_counts(request: Request) -> None:
    for name in ("steps", "height", "width", "frames", "n", "fps"):
        value = getattr(request, name)
        if value is not None and (not is_int(value) or value < 1):
            raise PlanError(f"{name} must be a positive integer, got {value!r}.")
    if not is_int(request.seed):
        raise PlanError(f"seed must be an integer, got {request.seed!r}.")


def _check_guidance(taken: set[str], request: Request, name: str) -> None:
    for option in ("negative_prompt", "guidance_scale", "true_cfg_scale"):
        if getattr(request, option) is not None and option not in taken:
            raise PlanError(f"{option}: {name} takes no {option}.")


def _image_required(pipe) -> bool:
    """An image argument without a default (Wan I2V, Qwen-Image-Edit): the pipeline cannot run without it."""
    parameter = inspect.signature(type(pipe).__call__).parameters["image"]
    return parameter.default is inspect.Parameter.empty


def pipe_kwargs(pipe, request: Request) -> dict:
    """The pipeline keyword arguments of `request` (prompt, generator and output type are added by `generate`)."""
    taken = call_parameters(pipe)
    count = "num_videos_per_prompt" if "num_videos_per_prompt" in taken else "num_images_per_prompt"
    given = {
        "num_inference_steps": request.steps,
        "height": request.height,
        "width": request.width,
        "num_frames": request.frames,
        "image": request.image,
        "negative_prompt": request.negative_prompt,
        "guidance_scale": request.guidance_scale,
        "true_cfg_scale": request.true_cfg_scale,
        count: request.n if request.n != 1 else None,
    }
    return {name: value for name, value in given.items() if value is not None} | dict(request.extra)


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Request))
