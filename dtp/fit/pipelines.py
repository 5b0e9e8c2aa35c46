"""What `dtp fit` needs to know about a pipeline: its components on the meta device, and how each phase calls them.

A pipeline is a released one (`families/released_pipelines.py`: the public checkpoints' configs) or a diffusers
pipeline directory, of which only `model_index.json` (a modular pipeline's `modular_model_index.json`: FLUX.3 is
released as one, `dtp/pipeline/modular.py`) and each component's `config.json` are read.

The three phases of a generation and the call each one makes (shapes for an H x W image, batch B):

    text      every text encoder on its prompt tokens: CLIP 77, T5 / UMT5 / Mistral / Qwen2.5-VL 512
              (LLM encoders return every layer's hidden states: `output_hidden_states=True`)
    denoise   one transformer call at the full size its family's geometry gives (`analysis/inputs.py`: e.g.
              (H/16)(W/16) image tokens for VAE 8x, patch 2) and 512 text tokens
    decode    `vae.decode` of [B, C, H/8, W/8] latents ([B, C, F, H/8, W/8] for 3-D VAEs, F = (frames - 1)/4 + 1)

(8 is the released VAEs' scale; the decode reads it from the VAE's config as diffusers' pipelines do.)

A denoising step's guidance passes (`FitPipeline.guidance`: the rows of each transformer call per prompt row, as the
released pipeline calls it at its recommended settings, diffusers 0.42.1; `RELEASED_GUIDANCE`):

    flux-pipeline, flux2-pipeline   (1,)        guidance-distilled: one call, the guidance scale an input
    qwenimage-pipeline              (1, 1)      true CFG: a conditional and an unconditional call
    wan-pipeline, wan-vace-pipeline (1, 1)      CFG as two calls
    hunyuanvideo15-pipeline         (1, 1)      CFG as two calls
    flux3-pipeline                  (1, 1)      the modular pipeline's ClassifierFreeGuidance guider (scale 3.5):
                                                one call per guider batch
    ltx2-pipeline                   (2, 1, 1)   LTX2Pipeline with its defaults (guidance_scale 3, stg_scale 1,
                                                modality_scale 3): CFG on a doubled batch, then the spatio-temporal
                                                guidance call and the modality-isolation call: 4 passes in 3 calls

A pipeline directory: (1, 1) for a family whose geometry says two-call CFG, else (1,); a modular one the released
pipeline's of its transformer class where there is one (FLUX.3's guider: two calls), as the modular blocks run it.

Other components each run in one phase, whole on every rank (`EXTRA_PHASES`), their weights resident throughout:
LTX-2's text connectors in the text phase (on the prompt's stacked hidden states, both CFG rows), its audio VAE's
decode and vocoder in the decode phase, on the audio latents of the clip's duration
(`audio_decode_inputs`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..analysis.inputs import DEFAULT_TEXT_TOKENS
from ..analysis.released import RELEASED_PIPELINES, build_component
from ..errors import PlanError
from ..families import Geometry, geometry
from ..loading import build_skeleton
from ..pipeline.modular import MODULAR_INDEX, STANDARD_INDEX, component_folder, is_modular
from ..vae.apply import VIDEO_VAES  # 3-D latents [B, C, frames, h, w]: one list with the parallel VAE's

PROMPT_TOKENS = DEFAULT_TEXT_TOKENS  # T5 / Mistral / Qwen2.5-VL / UMT5 prompt length the pipelines pad or cap to
CLIP_TOKENS = 77
DEFAULT_IMAGE_SIDE = 1024  # `dtp fit`'s image size when none is given (every bundled image pipeline's native one)
ENCODER_ONLY = ("CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel", "UMT5EncoderModel")
EXTRA_PHASES = {"connectors": "text", "audio_vae": "decode", "vocoder": "decode"}  # component -> the phase it runs in
LTX2_FPS = 24  # LTX2Pipeline's default frame_rate: a clip's duration, which sizes its audio
TRUE_CFG = (1, 1)
RELEASED_GUIDANCE = {
    "flux-pipeline": (1,),
    "flux2-pipeline": (1,),
    "qwenimage-pipeline": TRUE_CFG,
    "wan-pipeline": TRUE_CFG,
    "wan-vace-pipeline": TRUE_CFG,
    "hunyuanvideo15-pipeline": TRUE_CFG,
    "flux3-pipeline": TRUE_CFG,
    "ltx2-pipeline": (2, 1, 1),
}  # the module docstring's table


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
    released_size: tuple[int, int, int] | None = None
    """A released checkpoint's own (frames, height, width) (`ReleasedPipeline.size`); None: the family's clip."""
    modular: bool = False
    """A modular pipeline folder (`modular_model_index.json`): components where its index's subfolders say."""

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
    def extras(self) -> dict[str, str]:
        """{component: phase} of the components other than the transformer, the text encoders and the VAE (LTX-2's
        connectors, audio VAE, vocoder), in the order the pipeline runs them."""
        return {n: EXTRA_PHASES[n] for n in self.classes if n in EXTRA_PHASES}

    @property
    def geometry(self) -> Geometry:
        """The transformer family's geometry (`families/geometry.py`): clip, two-call CFG, pixels per token."""
        return geometry(self.classes[self.transformer])

    @property
    def is_video(self) -> bool:
        return self.geometry.is_video

    @property
    def usual_frames(self) -> int | None:
        """Frames of the pipeline's usual clip (Wan: 81); None for an image pipeline."""
        return self.usual_size[0] if self.geometry.is_video else None

    @property
    def usual_size(self) -> tuple[int, int, int]:
        """(frames, height, width) `dtp fit` sizes a generation at when none is given: the released checkpoint's,
        else the family's usual clip, else one 1024² image."""
        if self.released_size is not None:
            return self.released_size
        return self.geometry.clip if self.geometry.is_video else (1, DEFAULT_IMAGE_SIDE, DEFAULT_IMAGE_SIDE)

    @property
    def guidance(self) -> tuple[int, ...]:
        """Rows per prompt row of each transformer call of a step (module docstring): (1, 1) two-call CFG, (2, 1, 1)
        LTX-2's doubled CFG batch, STG and modality calls."""
        if self.name in RELEASED_GUIDANCE:
            return RELEASED_GUIDANCE[self.name]
        if self.modular:
            transformer = self.classes[self.transformer]
            for name, released in RELEASED_PIPELINES.items():
                if released.components["transformer"].class_name == transformer and name in RELEASED_GUIDANCE:
                    return RELEASED_GUIDANCE[name]
        return TRUE_CFG if self.geometry.two_call_cfg else (1,)

    def component_dir(self, name: str) -> Path:
        """The folder of component `name` in `model_dir` (a modular index's subfolder, else the name)."""
        return Path(component_folder(self.model_dir, name) if self.modular else Path(self.model_dir) / name)

    @property
    def passes(self) -> int:
        """Guidance passes per step: what a cfg axis of K groups (K dividing it) splits."""
        return sum(self.guidance)

    @property
    def calls_per_step(self) -> int:
        return len(self.guidance)


def fit_pipeline(source: str) -> FitPipeline:
    """A released pipeline by name, else a diffusers pipeline directory; PlanError naming both otherwise."""
    if source in RELEASED_PIPELINES:
        released = RELEASED_PIPELINES[source]
        return FitPipeline(
            name=source,
            title=released.title,
            classes={n: c.class_name for n, c in released.components.items()},
            build=lambda name, dtype: build_component(released.components[name], dtype),
            model_dir=released.model_dir,
            released_size=released.size,
        )
    modular = is_modular(source)
    index = Path(source) / (MODULAR_INDEX if modular else STANDARD_INDEX)
    if not index.is_file():
        raise PlanError(
            f"'{source}' is neither a released pipeline ({', '.join(RELEASED_PIPELINES)}) nor a pipeline "
            f"directory with a {STANDARD_INDEX} (or a modular pipeline's {MODULAR_INDEX})."
        )
    classes = _model_classes(json.loads(index.read_text()))
    if modular:  # a component its index names but the folder lacks (FLUX.3's prompt upsampler): not loaded, not run
        classes = {n: c for n, c in classes.items() if os.path.isdir(component_folder(source, n))}
    for needed in ("transformer", "vae"):
        if needed not in classes:
            raise PlanError(f"{index}: no '{needed}' component; dtp fit needs a transformer and a VAE.")
    pipeline = FitPipeline(
        name=source,
        title=Path(source).name,
        classes=classes,
        build=lambda name, dtype: _build_from_dir(pipeline.component_dir(name), classes[name], dtype),
        model_dir=source,
        modular=modular,
    )
    return pipeline


def _model_classes(index: dict) -> dict[str, str]:
    """{component: class} of the model components of a pipeline index: entries [library, class] (a modular index's
    [library, class, spec] too)."""
    return {
        name: entry[1]
        for name, entry in index.items()
        if isinstance(entry, list) and len(entry) in (2, 3) and entry[0] in ("diffusers", "transformers")
        and entry[1] and (name in ("transformer", "vae", *EXTRA_PHASES) or name.startswith("text_encoder"))
    }  # fmt: skip


def _build_from_dir(folder: Path, class_name: str, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    from ..families import model_class

    try:
        cls = model_class(class_name)
    except PlanError:
        cls = getattr(transformers, class_name, None)
    if cls is None:
        raise PlanError(f"{folder}: neither diffusers nor transformers has a class '{class_name}'.")
    return build_skeleton(cls, str(folder), dtype).eval()


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
    if "spatial_expansions" in vae_config:  # AutoencoderKLMochi: 2 x 2 x 2 (MochiPipeline's vae_spatial_scale_factor)
        return math.prod(vae_config["spatial_expansions"])
    if "spatio_temporal_scaling" in vae_config:  # LTX-Video: patchify x one 2x per scaling stage (32)
        return vae_config["patch_size"] * 2 ** sum(vae_config["spatio_temporal_scaling"])
    if "temperal_downsample" in vae_config:  # Qwen-Image / Wan 3-D VAEs
        return 2 ** len(vae_config["temperal_downsample"])
    if "encoder_block_out_channels" in vae_config:  # AutoencoderDC (Sana's DC-AE: 32), as SanaPipeline computes it
        return 2 ** (len(vae_config["encoder_block_out_channels"]) - 1)
    if "spatial_downsample_factors" in vae_config:  # MiniMax-H3: one factor per level
        return math.prod(vae_config["spatial_downsample_factors"])
    return 2 ** (len(vae_config["block_out_channels"]) - 1)


def vae_time_scale(vae_config) -> int:
    """Frames per latent frame after the first, as the video VAE's config says (4 for Wan and HunyuanVideo, 8 for
    LTX-Video)."""
    if vae_config.get("temporal_compression_ratio"):
        return vae_config["temporal_compression_ratio"]
    if "temporal_expansions" in vae_config:  # AutoencoderKLMochi: 1 x 2 x 3 = 6 (MochiPipeline: 6)
        return math.prod(vae_config["temporal_expansions"])
    if "spatio_temporal_scaling" in vae_config:
        return vae_config["patch_size_t"] * 2 ** sum(vae_config["spatio_temporal_scaling"])
    if "temperal_downsample" in vae_config:
        return 2 ** sum(vae_config["temperal_downsample"])
    if "spatial_group_norm" in vae_config:  # AutoencoderKLMagvit (EasyAnimate: 4), as diffusers computes it
        return 2 ** (len(vae_config["block_out_channels"]) - 2)
    if "temporal_downsample_factors" in vae_config:  # MiniMax-H3
        return math.prod(vae_config["temporal_downsample_factors"])
    return 4


def latent_frames(frames: int, time_scale: int) -> int:
    """Latent frames of a clip: the video VAEs keep the first frame and compress the rest `time_scale` x."""
    return (frames - 1) // time_scale + 1


def decode_inputs(vae: torch.nn.Module, dtype: torch.dtype, shape: Shape, video: bool = False) -> dict:
    """`vae.decode`'s latents (meta tensor) for `shape`: [B, C, F, h, w] for a VAE the parallel VAE knows as a video
    one (Qwen-Image's too, F = 1) and for every VAE of a video pipeline (`video`: one the parallel VAE does not split
    yet, traced whole), else [B, C, h, w]."""
    channels = vae.config.get("latent_channels") or vae.config.get("z_dim")
    scale = vae_scale(vae.config)
    for what, value in (("height", shape.height), ("width", shape.width)):
        if value < scale or value % scale:
            raise PlanError(f"{what} {value} px must be a positive multiple of {scale} (the VAE's {scale}x).")
    h, w = shape.height // scale, shape.width // scale
    if video or type(vae).__name__ in VIDEO_VAES:
        size = (shape.batch, channels, latent_frames(shape.frames, vae_time_scale(vae.config)), h, w)
    else:
        size = (shape.batch, channels, h, w)
    return {"z": torch.empty(size, dtype=dtype, device="meta")}


def decode(vae, z):
    return vae.decode(z, return_dict=False)


def connector_inputs(connectors: torch.nn.Module, dtype: torch.dtype, shape: Shape) -> dict:
    """LTX-2's connectors' call (meta): every Gemma layer's hidden states stacked, [B, T, width x layers], and the
    prompt mask, as LTX2Pipeline passes them (B: the CFG pair's rows, `Setup.batch`)."""
    config = connectors.config
    width = config["caption_channels"] * config["text_proj_in_factor"]
    states = torch.empty(shape.batch, shape.text_tokens, width, dtype=dtype, device="meta")
    return {"text_encoder_hidden_states": states, "attention_mask": torch.ones(states.shape[:2], device="meta")}


def audio_frames(audio_vae_config, frames: int) -> int:
    """Audio latent frames of a clip of `frames` video frames at 24 fps, as LTX2Pipeline computes them: its duration x
    sample rate / hop length / the audio VAE's 4x in time (16000 / 160 / 4 = 25 a second; 121 frames: 126)."""
    per_second = audio_vae_config["sample_rate"] / audio_vae_config["mel_hop_length"] / AUDIO_TIME_SCALE
    return round(frames / LTX2_FPS * per_second)


AUDIO_TIME_SCALE = AUDIO_MEL_SCALE = 4  # AutoencoderKLLTX2Audio's temporal and mel compression


def audio_decode_inputs(audio_vae: torch.nn.Module, dtype: torch.dtype, shape: Shape) -> dict:
    """The audio VAE's decode latents (meta): [B, latent channels, audio frames, mel bins / 4]."""
    config = audio_vae.config
    mel = config["mel_bins"] // AUDIO_MEL_SCALE
    size = (shape.batch, config["latent_channels"], audio_frames(config, shape.frames), mel)
    return {"z": torch.empty(size, dtype=dtype, device="meta")}


def vocoder_inputs(vocoder: torch.nn.Module, dtype: torch.dtype, shape: Shape, audio_vae_config) -> dict:
    """The vocoder's mel spectrogram (meta), the audio VAE decode's output: [B, 2, 4 x audio frames - 3, mel bins]
    (measured on a small AutoencoderKLLTX2Audio: latents of 10 frames decode to 37)."""
    frames = AUDIO_TIME_SCALE * audio_frames(audio_vae_config, shape.frames) - (AUDIO_TIME_SCALE - 1)
    channels = vocoder.config["in_channels"] // audio_vae_config["mel_bins"]
    size = (shape.batch, channels, frames, audio_vae_config["mel_bins"])
    return {"hidden_states": torch.empty(size, dtype=dtype, device="meta")}


def text_inputs(encoder: torch.nn.Module, shape: Shape) -> dict:
    """Prompt token ids (meta) and the kwargs the pipelines pass to this text encoder."""
    name = type(encoder).__name__
    tokens = CLIP_TOKENS if name.startswith("CLIP") else shape.text_tokens
    ids = torch.zeros(shape.batch, tokens, dtype=torch.long, device="meta")
    if name in ENCODER_ONLY:
        return {"input_ids": ids}
    mask = torch.ones(shape.batch, tokens, dtype=torch.long, device="meta")
    return {"input_ids": ids, "attention_mask": mask, "output_hidden_states": True, "use_cache": False}
