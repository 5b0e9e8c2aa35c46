"""Per-rank activation peak of one full-size transformer forward under a (cp, tp) mesh, next to one rank's.

    forward_peak(class_name, plan, cp=, tp=, shape=)   the model built at full size on the meta device,
        each block list cut to its first block (`trace.truncate_blocks`), sharded by `plan` on rank 0 of a
        fake world of cp * tp ranks exactly as `parallelize` shards it (the cp hooks included: this rank
        runs its 1/cp of the sequence and the real all-to-alls / ring passes), then run once in bf16 on
        fake cpu tensors under `trace.PhaseTrace`: the peak of bytes created during the forward and alive
        at once (parameters, buffers and the inputs left out: they are resident)
    peak_report(...)   that peak at (cp, tp) and at (1, 1) (one rank holding everything), and

        ideal = one rank's peak / (cp * tp)       ratio = per-rank peak / ideal (1.00: perfectly divided)

Why one block per list is enough: only the residual stream (and what the model computes once before its
blocks: RoPE tables, modulation, text states) crosses a block boundary, so the forward's peak is reached
inside one block or in the head/tail, and a cut model has both (`trace.py` checks it on FLUX.1).

Full-size inputs, batch 1 (`forward_inputs`): an image model gets a square of R pixels, R / 16 pixels per
token side (VAE 8x, patch 2; 32 for the 32x VAEs of Sana and HunyuanImage 2.1). A video model gets
its usual clip (`VIDEO_CLIPS`: Wan 81 frames of 480 x 832 px, HunyuanVideo 129 of 720 x 1280, ...) or
`frames` frames of R x W px (W: 832 for 480p, 1280 for 720p, else R * 16 / 9 rounded to 16): its latent
video (frames - 1) / t + 1 x R / s x W / s with each family's VAE factors (t, s); the transformer
patches it itself. Prompts are `text_tokens` long (CogVideoX: its config's 226).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..analysis.fakepg import fake_world, meta_inputs, meta_model
from ..engine import apply, prepare
from ..errors import PlanError
from ..families import FAMILIES
from ..plan import Plan
from ..policy import check_degree
from ..runtime.mesh import make_mesh
from .trace import fake_like, fake_mode, to_fake, trace_call, truncate_blocks

DEFAULT_TEXT_TOKENS = 512
INDEXED_LISTS = ("caption_projection",)  # HiDream's forward indexes it per text layer: kept whole, not cut
PIXELS_PER_TOKEN = 16  # VAE 8x, patch 2: every bundled image model but the two below
PIXELS_PER_TOKEN_32 = ("SanaTransformer2DModel", "HunyuanImageTransformer2DModel")  # 32x VAEs, patch 1
# Video VAEs: (frames per latent frame after the first, pixels per latent pixel), and each model's usual clip.
VIDEO_VAES = {
    "WanTransformer3DModel": (4, 8),
    "SkyReelsV2Transformer3DModel": (4, 8),
    "HunyuanVideoTransformer3DModel": (4, 8),
    "CogVideoXTransformer3DModel": (4, 8),
    "LTXVideoTransformer3DModel": (8, 32),
    "MochiTransformer3DModel": (6, 8),
    "CosmosTransformer3DModel": (8, 8),
}
# Each video model's usual clip: (frames, height, width) in pixels, as its released pipeline generates it.
VIDEO_CLIPS = {
    "WanTransformer3DModel": (81, 480, 832),
    "SkyReelsV2Transformer3DModel": (97, 544, 960),
    "HunyuanVideoTransformer3DModel": (129, 720, 1280),
    "CogVideoXTransformer3DModel": (49, 480, 720),
    "LTXVideoTransformer3DModel": (161, 480, 704),
    "MochiTransformer3DModel": (163, 480, 848),
    "CosmosTransformer3DModel": (121, 704, 1280),
}
VIDEO_WIDTHS = {480: 832, 720: 1280}  # 480p / 720p of the released video pipelines (Wan, HunyuanVideo)
DEFAULT_RESOLUTION = 1024  # image side when none is given


@dataclass(frozen=True)
class ForwardShape:
    """What one forward runs on: batch 1 unless told, a square image of `resolution` px or a video clip."""

    resolution: int | None = None
    """Image side (None: 1024), or video height (None: the model's usual clip), in pixels."""
    frames: int | None = None
    """Video frames (None: the model's usual clip length); refused for an image model."""
    text_tokens: int = DEFAULT_TEXT_TOKENS
    batch: int = 1


@dataclass(frozen=True)
class ForwardPeak:
    """One rank's activation peak of one forward, and what the forward ran on."""

    peak_bytes: int
    tokens: int
    """Image / video tokens of the whole sequence (before the cp split)."""
    input: str
    """The input in the model's terms (`1024x1024 px`, `latent video 21 x 60 x 104 ...`)."""


def forward_peak(
    class_name: str,
    plan: Plan | None,
    *,
    cp: int = 1,
    tp: int = 1,
    cp_mode: str = "ulysses",
    pad: bool = False,
    shape: ForwardShape = ForwardShape(),
    dtype: torch.dtype = torch.bfloat16,
    config: dict | None = None,
) -> ForwardPeak:
    """The activation peak of rank 0 of a (cp, tp) world in one forward at `shape` (module docstring).

    PlanError when the plan refuses (cp, tp) or the model has no input builder; ForwardError from the
    cp hooks when cp does not divide the sequence.
    """
    check_degree(cp, "forward peak: cp")
    check_degree(tp, "forward peak: tp")
    model = meta_model(class_name, config, dtype)
    truncate_blocks(model, keep=1, skip=INDEXED_LISTS)
    inputs, tokens, described = forward_inputs(class_name, dict(model.config), dtype, shape)
    with fake_world(cp * tp):
        if cp * tp > 1:
            prepared = prepare(model, make_mesh(tp=tp, cp=cp, device_type="cpu"), plan, cp_mode=cp_mode, pad=pad)
            apply(model, prepared)
        with fake_mode():
            to_fake(model)
            trace = trace_call(model, _call, {k: fake_like(v) for k, v in inputs.items()})
    return ForwardPeak(peak_bytes=trace.peak_bytes, tokens=tokens, input=described)


def peak_report(
    class_name: str,
    plan: Plan | None,
    *,
    cp: int,
    tp: int,
    cp_mode: str = "ulysses",
    pad: bool = False,
    shape: ForwardShape = ForwardShape(),
    dtype: torch.dtype = torch.bfloat16,
    config: dict | None = None,
    one: ForwardPeak | None = None,
) -> dict:
    """`forward_peak` at (cp, tp) and at (1, 1) (`one`, when already measured for this shape), with
    ideal = one rank / (cp tp) and their ratio (a dict)."""
    common = dict(shape=shape, dtype=dtype, config=config)
    one = one or forward_peak(class_name, plan, **common)
    sharded = forward_peak(class_name, plan, cp=cp, tp=tp, cp_mode=cp_mode, pad=pad, **common)
    ideal = one.peak_bytes / (cp * tp)
    return {
        "cp": cp,
        "tp": tp,
        "cp_mode": cp_mode,
        "input": one.input,
        "tokens": one.tokens,
        "one_rank_bytes": one.peak_bytes,
        "per_rank_bytes": sharded.peak_bytes,
        "ideal_bytes": int(ideal),
        "ratio": sharded.peak_bytes / ideal,
    }


def _call(model, **kwargs):
    return model(**kwargs)


# ---------------------------------------------------------------------------------------------
# full-size inputs


def forward_inputs(class_name: str, config: dict, dtype: torch.dtype, shape: ForwardShape):
    """(forward kwargs as meta tensors, image/video tokens, a description) for `shape` (module docstring)."""
    if class_name not in FAMILIES:
        raise PlanError(f"forward peak: no input builder for {class_name}; bundled: {', '.join(sorted(FAMILIES))}.")
    if class_name in VIDEO_VAES:
        return _video_inputs(class_name, config, dtype, shape)
    if shape.frames is not None:
        raise PlanError(f"forward peak: --frames {shape.frames} applies to a video model, not {class_name}.")
    side = shape.resolution or DEFAULT_RESOLUTION
    step = 32 if class_name in PIXELS_PER_TOKEN_32 else PIXELS_PER_TOKEN
    _check_multiple("resolution", side, step)
    tokens = (side // step) ** 2
    txt = _text_tokens(class_name, config, shape)
    inputs = meta_inputs(class_name, config, dtype, img_tokens=tokens, txt_tokens=txt, batch=shape.batch)
    return inputs, tokens, f"{side}x{side} px, {tokens} image + {txt} text tokens"


def video_size(class_name: str, shape: ForwardShape) -> tuple[int, int, int]:
    """(frames, height, width) in pixels of the clip `shape` asks for: the model's usual clip where `shape` says
    nothing; a height other than the usual one gets `VIDEO_WIDTHS` or 16:9 (rounded to 16 px)."""
    frames, height, width = VIDEO_CLIPS[class_name]
    if shape.resolution is not None and shape.resolution != height:
        height = shape.resolution
        width = VIDEO_WIDTHS.get(height) or round(height * 16 / 9 / 16) * 16
    return shape.frames if shape.frames is not None else frames, height, width


def latent_grid(class_name: str, config: dict, shape: ForwardShape) -> tuple[int, int, int]:
    """(frames, height, width) of the latent video: (f - 1) / t + 1, h / s, w / s; PlanError when they are not whole
    tokens (the spatial patch must divide h / s and w / s)."""
    t, s = VIDEO_VAES[class_name]
    frames, height, width = video_size(class_name, shape)
    if frames < 1 or (frames - 1) % t:
        raise PlanError(f"forward peak: {class_name} takes 1 + {t} k frames (its VAE's {t}x in time), not {frames}.")
    patch = _spatial_patch(config)
    _check_multiple("height", height, s * patch)
    _check_multiple("width", width, s * patch)
    return (frames - 1) // t + 1, height // s, width // s


def _video_inputs(class_name: str, config: dict, dtype: torch.dtype, shape: ForwardShape):
    """The family's inputs for a small clip, with the latent video replaced by the full-size one."""
    f, h, w = latent_grid(class_name, config, shape)
    txt = _text_tokens(class_name, config, shape)
    inputs = meta_inputs(class_name, config, dtype, img_tokens=16, txt_tokens=txt, batch=shape.batch)
    latent = inputs["hidden_states"]
    channels = latent.shape[2] if class_name == "CogVideoXTransformer3DModel" else latent.shape[1]
    if "num_frames" in inputs:  # LTX: patch 1, tokens [B, f h w, C] with the grid beside them
        size = (shape.batch, f * h * w, latent.shape[-1])
        inputs.update(num_frames=f, height=h, width=w)
    elif class_name == "CogVideoXTransformer3DModel":  # [B, F, C, H, W]
        size = (shape.batch, f, channels, h, w)
    else:  # [B, C, F, H, W]
        size = (shape.batch, channels, f, h, w)
    inputs["hidden_states"] = torch.empty(size, dtype=latent.dtype, device="meta")
    patch = _spatial_patch(config)
    tokens = (f // _temporal_patch(config)) * (h // patch) * (w // patch)
    frames, height, width = video_size(class_name, shape)
    described = (
        f"{frames} frames of {height}x{width} px = latent video {f} x {h} x {w}, {tokens} video + {txt} text tokens"
    )
    return inputs, tokens, described


def _spatial_patch(config: dict) -> int:
    patch = config.get("patch_size", 1)
    return patch[-1] if isinstance(patch, list | tuple) else patch


def _temporal_patch(config: dict) -> int:
    patch = config.get("patch_size", 1)
    if isinstance(patch, list | tuple):
        return patch[0]
    return config.get("patch_size_t") or 1


def _text_tokens(class_name: str, config: dict, shape: ForwardShape) -> int:
    """CogVideoX's prompt is its config's fixed `max_text_seq_length`; every other model takes `text_tokens`."""
    return config.get("max_text_seq_length", shape.text_tokens)


def _check_multiple(what: str, value: int, step: int) -> None:
    if value < step or value % step:
        raise PlanError(f"forward peak: {what} {value} px must be a positive multiple of {step} (whole tokens).")
