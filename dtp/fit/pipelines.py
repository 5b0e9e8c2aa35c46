"""What `dtp fit` needs to know about a pipeline: its components on the meta device, and how each phase calls them.

A pipeline is a released one (`released.py`: the public checkpoints' configs) or a diffusers pipeline
directory, of which only `model_index.json` and each component's `config.json` are read.

The three phases of a generation and the call each one makes (shapes for an H x W image, batch B):

    text      every text encoder on its prompt tokens: CLIP 77, T5 / UMT5 / Mistral / Qwen2.5-VL 512
              (LLM encoders return every layer's hidden states: `output_hidden_states=True`)
    denoise   one transformer call: (H/16)(W/16) image tokens (VAE 8x, patch 2) and 512 text tokens
    decode    `vae.decode` of [B, C, H/8, W/8] latents ([B, C, F, H/8, W/8] for 3-D VAEs, F = (frames - 1)/4 + 1)

(8 is the released VAEs' scale; it is read from the VAE's config as diffusers' pipelines do.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..analysis.fakepg import meta_inputs
from ..analysis.released import RELEASED_PIPELINES, T5_XXL, Component, ReleasedPipeline, build_component
from ..errors import PlanError
from ..loading import build_skeleton
from ..vae.apply import VIDEO_VAES  # 3-D latents [B, C, frames, h, w]: one list with the parallel VAE's

PATCH = 2  # latent pixels per token side, every supported transformer
PROMPT_TOKENS = 512  # T5 / Mistral / Qwen2.5-VL / UMT5 prompt length the pipelines pad or cap to
CLIP_TOKENS = 77
VIDEO_TRANSFORMERS = ("WanTransformer3DModel",)
ENCODER_ONLY = ("CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel", "UMT5EncoderModel")
# Pipelines that run classifier-free guidance as two transformer calls per step at their recommended settings.
TWO_CALLS = ("QwenImageTransformer2DModel", "WanTransformer3DModel")
# The checkpoint folder a `dtp run` command names for a released pipeline.
CHECKPOINT_DIRS = {
    "flux-pipeline": "./FLUX.1-dev",
    "flux2-pipeline": "./FLUX.2-dev",
    "qwenimage-pipeline": "./Qwen-Image",
    "wan-pipeline": "./Wan2.1-T2V-14B-Diffusers",
}
VIDEO_FRAMES = 81  # Wan's default clip length
# google/umt5-xxl encoder (Wan 2.1 text_encoder): 5.68 B parameters.
UMT5_XXL = {**T5_XXL, "vocab_size": 256384}  # T5 v1.1 XXL's shape with UMT5's vocabulary
# Video pipelines `dtp fit` knows besides `released.RELEASED_PIPELINES`. Wan 2.1 T2V 14B: the diffusers class
# defaults of WanTransformer3DModel (40 layers, 40 heads of 128) and AutoencoderKLWan are the 14B checkpoint's.
VIDEO_PIPELINES = {
    "wan-pipeline": ReleasedPipeline(
        title="Wan2.1-T2V-14B",
        components={
            "transformer": Component(class_name="WanTransformer3DModel"),
            "text_encoder": Component(class_name="UMT5EncoderModel", config=UMT5_XXL, config_class="UMT5Config"),
            "vae": Component(class_name="AutoencoderKLWan", config={}),
        },
    )
}
PIPELINES = {**RELEASED_PIPELINES, **VIDEO_PIPELINES}


@dataclass(frozen=True, kw_only=True)
class FitPipeline:
    """A pipeline as `dtp fit` sees it."""

    name: str
    """The released pipeline's name or the directory, as given."""
    title: str
    classes: Mapping[str, str]
    """Model component name -> class name (schedulers and tokenizers left out)."""
    build: Callable[[str, torch.dtype], torch.nn.Module]
    """(component name, dtype) -> that component on the meta device, eval mode."""
    model_dir: str
    """The checkpoint directory the `dtp run` command names."""

    @property
    def transformer(self) -> str:
        return "transformer"

    @property
    def vae(self) -> str:
        return "vae"

    @property
    def text_encoders(self) -> list[str]:
        return [n for n in self.classes if n.startswith("text_encoder")]

    @property
    def is_video(self) -> bool:
        return self.classes[self.transformer] in VIDEO_TRANSFORMERS

    @property
    def calls_per_step(self) -> int:
        return 2 if self.classes[self.transformer] in TWO_CALLS else 1


def fit_pipeline(source: str) -> FitPipeline:
    """A released pipeline by name, else a diffusers pipeline directory; PlanError naming both otherwise."""
    if source in PIPELINES:
        released = PIPELINES[source]
        return FitPipeline(
            name=source,
            title=released.title,
            classes={n: c.class_name for n, c in released.components.items()},
            build=lambda name, dtype: build_component(released.components[name], dtype),
            model_dir=CHECKPOINT_DIRS.get(source, f"./{released.title}"),
        )
    index = Path(source) / "model_index.json"
    if not index.is_file():
        raise PlanError(
            f"'{source}' is neither a released pipeline ({', '.join(PIPELINES)}) nor a pipeline "
            f"directory with a model_index.json."
        )
    classes = _model_classes(json.loads(index.read_text()))
    for needed in ("transformer", "vae"):
        if needed not in classes:
            raise PlanError(f"{index}: no '{needed}' component; dtp fit needs a transformer and a VAE.")
    return FitPipeline(
        name=source,
        title=Path(source).name,
        classes=classes,
        build=lambda name, dtype: _build_from_dir(source, name, classes[name], dtype),
        model_dir=source,
    )


def _model_classes(index: dict) -> dict[str, str]:
    return {
        name: entry[1]
        for name, entry in index.items()
        if isinstance(entry, list) and len(entry) == 2 and entry[0] in ("diffusers", "transformers")
        and entry[1] and (name in ("transformer", "vae") or name.startswith("text_encoder"))
    }  # fmt: skip


def _build_from_dir(directory: str, name: str, class_name: str, dtype: torch.dtype) -> torch.nn.Module:
    import diffusers
    import transformers

    cls = getattr(diffusers, class_name, None) or getattr(transformers, class_name, None)
    if cls is None:
        raise PlanError(f"{directory}/{name}: neither diffusers nor transformers has a class '{class_name}'.")
    return build_skeleton(cls, str(Path(directory) / name), dtype).eval()


# ---------------------------------------------------------------------------------------------
# the calls of each phase


@dataclass(frozen=True)
class Shape:
    """What is generated: batch, pixels, frames (1 for an image), prompt tokens of the LLM / T5 encoders."""

    batch: int
    height: int
    width: int
    frames: int = 1
    text_tokens: int = PROMPT_TOKENS


def vae_scale(vae_config) -> int:
    """Pixels per latent pixel, as diffusers' pipelines compute it from the VAE's config."""
    if vae_config.get("spatial_compression_ratio"):  # HunyuanVideo's (LTX's when set)
        return vae_config["spatial_compression_ratio"]
    if "spatio_temporal_scaling" in vae_config:  # LTX-Video: patchify x one 2x per scaling stage (32)
        return vae_config["patch_size"] * 2 ** sum(vae_config["spatio_temporal_scaling"])
    if "temperal_downsample" in vae_config:  # Qwen-Image / Wan 3-D VAEs
        return 2 ** len(vae_config["temperal_downsample"])
    return 2 ** (len(vae_config["block_out_channels"]) - 1)


def vae_time_scale(vae_config) -> int:
    """Frames per latent frame after the first, as the video VAE's config says (4 for Wan and HunyuanVideo, 8 for
    LTX-Video)."""
    if vae_config.get("temporal_compression_ratio"):
        return vae_config["temporal_compression_ratio"]
    if "spatio_temporal_scaling" in vae_config:
        return vae_config["patch_size_t"] * 2 ** sum(vae_config["spatio_temporal_scaling"])
    if "temperal_downsample" in vae_config:
        return 2 ** sum(vae_config["temperal_downsample"])
    return 4


def latent_size(shape: Shape, scale: int) -> tuple[int, int]:
    """(h, w) of the latents; PlanError when the image is not a whole number of tokens."""
    step = scale * PATCH
    for what, value in (("height", shape.height), ("width", shape.width)):
        if value < step or value % step:
            raise PlanError(f"dtp fit: {what} {value} must be a positive multiple of {step} (VAE {scale}x, patch 2).")
    return shape.height // scale, shape.width // scale


def denoise_inputs(class_name: str, config, dtype: torch.dtype, shape: Shape, scale: int, time_scale: int = 4) -> dict:
    """The transformer's forward kwargs (meta tensors) for one denoising call; `scale` / `time_scale`: the VAE's
    pixels per latent pixel / frames per latent frame."""
    h, w = latent_size(shape, scale)
    if class_name in VIDEO_TRANSFORMERS:
        return _video_inputs(config, dtype, shape, h, w, latent_frames(shape.frames, time_scale))
    img_tokens = (h // PATCH) * (w // PATCH)
    return meta_inputs(
        class_name, config, dtype, img_tokens=img_tokens, txt_tokens=shape.text_tokens, batch=shape.batch
    )


def latent_frames(frames: int, time_scale: int) -> int:
    """Latent frames of a clip: the video VAEs keep the first frame and compress the rest `time_scale` x."""
    return (frames - 1) // time_scale + 1


def _video_inputs(config, dtype: torch.dtype, shape: Shape, h: int, w: int, frames: int) -> dict:
    """Wan's forward kwargs: latents [B, C, F', h, w] (patch (1, 2, 2) inside the model), T5 states [B, L, 4096]."""
    latents = (shape.batch, config["in_channels"], frames, h, w)
    return {
        "hidden_states": torch.empty(latents, dtype=dtype, device="meta"),
        "timestep": torch.zeros(shape.batch, dtype=torch.long, device="meta"),
        "encoder_hidden_states": torch.empty(
            shape.batch, shape.text_tokens, config["text_dim"], dtype=dtype, device="meta"
        ),
        "return_dict": False,
    }


def decode_inputs(vae: torch.nn.Module, dtype: torch.dtype, shape: Shape) -> dict:
    """`vae.decode`'s latents (meta tensor) for `shape`."""
    channels = vae.config.get("latent_channels") or vae.config.get("z_dim")
    h, w = latent_size(shape, vae_scale(vae.config))
    if type(vae).__name__ in VIDEO_VAES:
        size = (shape.batch, channels, latent_frames(shape.frames, vae_time_scale(vae.config)), h, w)
    else:
        size = (shape.batch, channels, h, w)
    return {"z": torch.empty(size, dtype=dtype, device="meta")}


def decode(vae, z):
    return vae.decode(z, return_dict=False)


def text_inputs(encoder: torch.nn.Module, shape: Shape) -> dict:
    """Prompt token ids (meta) and the kwargs the pipelines pass to this text encoder."""
    name = type(encoder).__name__
    tokens = CLIP_TOKENS if name.startswith("CLIP") else shape.text_tokens
    ids = torch.zeros(shape.batch, tokens, dtype=torch.long, device="meta")
    if name in ENCODER_ONLY:
        return {"input_ids": ids}
    mask = torch.ones(shape.batch, tokens, dtype=torch.long, device="meta")
    return {"input_ids": ids, "attention_mask": mask, "output_hidden_states": True, "use_cache": False}


def call(module, **kwargs):
    return module(**kwargs)
