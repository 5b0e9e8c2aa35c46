"""Full-size forward inputs of a family's transformer, sized by its `Geometry` (`families/geometry.py`).

    image, H x W px       the family's own input builder fed (H / p) x (W / p) tokens, p = pixels per token
                          (16: VAE 8x, patch 2; 32 for Sana and HunyuanImage 2.1)
    video, F frames       the family's inputs for a small clip with `hidden_states` replaced by the full-size latent
                          video (F - 1) / t + 1 x H / s x W / s in the family's layout (t, s: its VAE's factors);
                          the transformer patches it itself

`forward_inputs` adds `dtp check`'s defaults: a 1024^2 image, or a video model's usual clip (Wan 81 frames of
480 x 832 px, HunyuanVideo 129 of 720 x 1280, ...) at another height when asked (832 wide for 480p, 1280 for
720p, else 16:9 rounded to 16 px). Prompts are `text_tokens` long (CogVideoX: its config's fixed 226).
The tensors are on the meta device; their values are never read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..choices import DEFAULT_TEXT_TOKENS  # T5 / Mistral / Qwen2.5-VL / UMT5 prompt length the pipelines pad or cap to
from ..errors import PlanError
from ..families import FAMILIES, Geometry
from .fakepg import meta_inputs

DEFAULT_RESOLUTION = 1024  # image side when none is given
VIDEO_WIDTHS = {480: 832, 720: 1280}  # 480p / 720p of the released video pipelines (Wan, HunyuanVideo)


@dataclass(frozen=True)
class ForwardShape:
    """What one forward runs on (`dtp check`): batch 1 unless told, a square image of `resolution` px or a clip."""

    resolution: int | None = None
    """Image side (None: 1024), or video height (None: the model's usual clip), in pixels."""
    frames: int | None = None
    """Video frames (None: the model's usual clip length); refused for an image model."""
    text_tokens: int = DEFAULT_TEXT_TOKENS
    batch: int = 1


@dataclass(frozen=True)
class FullInputs:
    """One forward's kwargs (meta tensors) and what they stand for."""

    kwargs: dict
    tokens: int
    """Image / video tokens of the whole sequence (before any cp split)."""
    text_tokens: int
    pixels: str
    """The input in pixels: `1024x1024 px`, `81 frames of 480x832 px = latent video 21 x 60 x 104`."""
    video: bool = False
    height: int = 0
    """Pixel height of the image or clip."""

    @property
    def described(self) -> str:
        kind = "video" if self.video else "image"
        return f"{self.pixels}, {self.tokens} {kind} + {self.text_tokens} text tokens"


def forward_inputs(class_name: str, config: dict, dtype: torch.dtype, shape: ForwardShape) -> FullInputs:
    """`full_inputs` at `shape` with `dtp check`'s defaults (module docstring)."""
    geometry = _geometry(class_name)
    if geometry.is_video:
        frames, height, width = video_size(geometry, shape)
    elif shape.frames is not None:
        raise PlanError(f"--frames {shape.frames} applies to a video model, not {class_name}.")
    else:
        frames, height, width = None, shape.resolution or DEFAULT_RESOLUTION, shape.resolution or DEFAULT_RESOLUTION
    sizes = dict(height=height, width=width, frames=frames, text_tokens=shape.text_tokens, batch=shape.batch)
    return full_inputs(class_name, config, dtype, **sizes)


def full_inputs(
    class_name: str,
    config: dict,
    dtype: torch.dtype,
    *,
    height: int,
    width: int,
    frames: int | None = None,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    batch: int = 1,
    vae: tuple[int, int] | None = None,
) -> FullInputs:
    """The transformer's forward kwargs for an H x W image (or F frames of it) at batch `batch`; PlanError when the
    sizes are not whole tokens or whole latent frames. `vae`: (scale, time scale) of the VAE this transformer is
    paired with, when it is not the family's released one (a pipeline directory's VAE config says them)."""
    geometry = _geometry(class_name)
    if vae is not None:
        geometry = replace(geometry, vae_scale=vae[0], vae_time_scale=vae[1] if geometry.is_video else 1)
    txt = config.get("max_text_seq_length", text_tokens)  # CogVideoX's prompt length is fixed by its config
    if geometry.is_video:
        return _video_inputs(class_name, geometry, config, dtype, (frames, height, width), txt, batch)
    step = geometry.pixels_per_token
    _check_multiple(class_name, geometry, "height", height, step)
    _check_multiple(class_name, geometry, "width", width, step)
    tokens = (height // step) * (width // step)
    kwargs = meta_inputs(class_name, config, dtype, img_tokens=tokens, txt_tokens=txt, batch=batch)
    return FullInputs(kwargs, tokens, txt, f"{height}x{width} px", height=height)


def video_size(geometry: Geometry, shape: ForwardShape) -> tuple[int, int, int]:
    """(frames, height, width) in pixels of the clip `shape` asks for: the usual clip where `shape` says nothing; a
    height other than the usual one gets `VIDEO_WIDTHS` or 16:9 (rounded to 16 px)."""
    frames, height, width = geometry.clip
    if shape.resolution is not None and shape.resolution != height:
        height = shape.resolution
        width = VIDEO_WIDTHS.get(height) or round(height * 16 / 9 / 16) * 16
    return shape.frames if shape.frames is not None else frames, height, width


def latent_grid(class_name: str, size: tuple[int, int, int], geometry: Geometry | None = None) -> tuple[int, int, int]:
    """(frames, height, width) of the latent video of a (frames, height, width) px clip: (f - 1) / t + 1, h / s,
    w / s; PlanError when they are not whole latent frames or tokens (the patch must divide h / s and w / s).
    `geometry`: the family's unless given."""
    geometry = geometry or _geometry(class_name)
    t, s = geometry.vae_time_scale, geometry.vae_scale
    frames, height, width = size
    if frames is None or frames < 1 or (frames - 1) % t:
        raise PlanError(f"{class_name} takes 1 + {t} k frames (its VAE's {t}x in time), not {frames}.")
    _check_multiple(class_name, geometry, "height", height, geometry.pixels_per_token)
    _check_multiple(class_name, geometry, "width", width, geometry.pixels_per_token)
    return (frames - 1) // t + 1, height // s, width // s


def _video_inputs(class_name, geometry: Geometry, config, dtype, size, txt: int, batch: int) -> FullInputs:
    """The family's inputs for a small clip, with the latent video replaced by the full-size one."""
    f, h, w = latent_grid(class_name, size, geometry)
    if geometry.layout == "video_packed":  # the family builds the packed sequence from the video token count
        tokens = (f // geometry.patch_t) * (h // geometry.patch) * (w // geometry.patch)
        kwargs = meta_inputs(class_name, config, dtype, img_tokens=tokens, txt_tokens=txt, batch=batch)
        pixels = f"{size[0]} frames of {size[1]}x{size[2]} px = latent video {f} x {h} x {w}"
        return FullInputs(kwargs, tokens, txt, pixels, video=True, height=size[1])
    kwargs = meta_inputs(class_name, config, dtype, img_tokens=16, txt_tokens=txt, batch=batch)
    latent = kwargs["hidden_states"]
    if geometry.layout == "video_tokens":  # LTX: tokens [B, f h w, C] with the grid beside them
        shape = (batch, f * h * w, latent.shape[-1])
        kwargs.update(num_frames=f, height=h, width=w)
    elif geometry.layout == "video_fchw":  # CogVideoX
        shape = (batch, f, latent.shape[2], h, w)
    else:  # [B, C, F, H, W], or [B, N, C, F, H, W]: N items side by side in time (JoyImage Edit's target + references)
        shape = (batch, *latent.shape[1:-3], f, h, w)
    kwargs["hidden_states"] = torch.empty(shape, dtype=latent.dtype, device="meta")
    for name in geometry.grid_inputs:  # e.g. Wan VACE's control video: the same grid, its own channels
        kwargs[name] = torch.empty((batch, kwargs[name].shape[1], f, h, w), dtype=kwargs[name].dtype, device="meta")
    regrid = FAMILIES[class_name].regrid  # inputs that follow the grid otherwise (Helios' histories)
    if regrid is not None:
        kwargs = regrid(kwargs, (f, h, w))
    items = latent.shape[1] if latent.dim() == 6 else 1
    tokens = items * (f // geometry.patch_t) * (h // geometry.patch) * (w // geometry.patch)
    frames, height, width = size
    pixels = f"{frames} frames of {height}x{width} px = latent video {f} x {h} x {w}"
    return FullInputs(kwargs, tokens, txt, pixels, video=True, height=height)


def _geometry(class_name: str) -> Geometry:
    if class_name not in FAMILIES:
        raise PlanError(f"no input builder for {class_name}; bundled: {', '.join(sorted(FAMILIES))}.")
    return FAMILIES[class_name].geometry


def _check_multiple(class_name: str, geometry: Geometry, what: str, value: int, step: int) -> None:
    if value < step or value % step:
        raise PlanError(
            f"{what} {value} px must be a positive multiple of {step} for {class_name} (VAE {geometry.vae_scale}x, "
            f"patch {geometry.patch}: whole tokens)."
        )
