"""Tiny random-weight pipelines that take an input image, in memory, for `dtp run --image` and `dtp serve`:

    WanPipeline              text to video, as `cfg_pipelines.tiny_wan_pipeline` but with a VAE that halves
                             time (frames = 2k + 1, as the released one's 4k + 1: 5 frames <-> 3 latent frames;
                             with a time factor of 1 diffusers always adds a frame)
    WanImageToVideoPipeline  the same parts with a transformer of 4 + 2 + 4 input channels: noise latents, the
                             first-frame mask (the VAE's time factor) and the image's latents, the way Wan 2.2's
                             image-to-video conditions (no CLIP image encoder: `image_dim` unset)
    FluxKontextPipeline      the tiny FLUX.1 components (`families.pipelines.tiny_flux_pipeline`); the
                             reference image's latents join the sequence. Call it with `KONTEXT_CALL`: without
                             `_auto_resize=False` and a small `max_area` it scales images to ~1024 x 1024
    Flux2Pipeline            the tiny FLUX.2 transformer, a 2-level FLUX.2 VAE (4 latent channels, packed 2 x 2
                             into the transformer's 16) and a 1-layer Mistral 3 text encoder of width 32 (= the
                             transformer's joint_attention_dim); call it with `FLUX2_CALL`, whose
                             `text_encoder_out_layers=(1,)` stacks one hidden state instead of the released (10,
                             20, 30). The reference image must be at least 64 x 64 (diffusers' check); its latents
                             join the sequence (64 x 64 -> 32 x 32 latents -> 256 tokens)

Qwen-Image-Edit is not here: its pipeline needs a `Qwen2VLProcessor`, which transformers 5 cannot build without
torchvision (its video processor; the lookup fails with "VIDEO_PROCESSOR_MAPPING has no attribute
_extra_content"), and the CPU torch here has no torchvision whose operators load.

Every weight is drawn from a fixed seed, the same on every rank.
"""

from __future__ import annotations

import numpy as np
import torch

from ..families.pipelines import SCHEDULER_CONFIG, qwen_tokenizer, tiny_flux_pipeline
from .cfg_pipelines import tiny_wan_pipeline
from .tiny import TINY_CONFIGS, tiny_model
from .tiny_vision import MISTRAL3, VISION_CLASSES

WAN_I2V_CALL = dict(height=16, width=16, num_frames=5, max_sequence_length=16)
KONTEXT_CALL = dict(height=32, width=32, max_area=32 * 32, _auto_resize=False)
FLUX2_CALL = dict(height=32, width=32, text_encoder_out_layers=(1,), max_sequence_length=32)
# The tokenizer's chat template: system and user text in the chat markers (Mistral 3's own template is not needed
# to exercise the pipeline; the text encoder is random).
_CHAT_TEMPLATE = (
    "{% for message in messages %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "<|im_start|>{{ part['text'] }}<|im_end|>{% endif %}{% endfor %}{% endfor %}"
)


def tiny_wan_video_pipeline():
    """The tiny WanPipeline (text to video) whose VAE halves time."""
    from diffusers import AutoencoderKLWan, WanPipeline

    latent = TINY_CONFIGS["WanTransformer3DModel"]["in_channels"]
    torch.manual_seed(1)
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=latent,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[True],
        latents_mean=[0.0] * latent,
        latents_std=[1.0] * latent,
        scale_factor_temporal=2,  # the pipeline sizes latents by these: 5 x 16 x 16 pixels <-> 3 x 8 x 8 latents
        scale_factor_spatial=2,
    )
    return WanPipeline(**{**tiny_wan_pipeline().components, "vae": vae})


def tiny_wan_i2v_pipeline():
    """The tiny WanImageToVideoPipeline: Wan's text-to-video parts, the image as extra latent channels."""
    from diffusers import WanImageToVideoPipeline

    parts = tiny_wan_video_pipeline().components
    latent = TINY_CONFIGS["WanTransformer3DModel"]["in_channels"]
    time_factor = parts["vae"].config.scale_factor_temporal
    transformer = tiny_model("WanTransformer3DModel", seed=0, in_channels=2 * latent + time_factor, out_channels=latent)
    return WanImageToVideoPipeline(
        tokenizer=parts["tokenizer"],
        text_encoder=parts["text_encoder"],
        vae=parts["vae"],
        scheduler=parts["scheduler"],
        transformer=transformer,
    )


def tiny_flux_kontext_pipeline():
    """The tiny FluxKontextPipeline: the tiny FLUX.1 pipeline's components under Kontext's call."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**tiny_flux_pipeline().components)


def tiny_flux2_pipeline():
    """The tiny Flux2Pipeline: FLUX.2 transformer, 2-level VAE, 1-layer Mistral 3 text encoder, byte tokenizer."""
    import transformers
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = _CHAT_TEMPLATE
    config = VISION_CLASSES[MISTRAL3]()
    config.text_config.vocab_size = -(-len(tokenizer) // 8) * 8  # the byte vocabulary, padded to split over tp
    torch.manual_seed(2)
    text_encoder = getattr(transformers, MISTRAL3)(config).eval()
    vae = tiny_flux2_vae(TINY_CONFIGS["Flux2Transformer2DModel"]["in_channels"] // 4)
    return Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=tiny_model("Flux2Transformer2DModel", seed=0),
    )


def tiny_flux2_vae(latent_channels: int):
    """FLUX.2's VAE (FLUX.3's too) at two tiny levels; `latent_channels`: the transformer's in_channels / 4."""
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(1)
    return AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=32,
    )


def sample_image(size: int = 32, seed: int = 0):
    """A random RGB PIL image, `size` x `size` (the same for a seed)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)
