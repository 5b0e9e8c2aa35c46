"""A medium-size FLUX.1 pipeline (random weights, no hub) for checks where the tiny one is too small to say much.

    transformer     FluxTransformer2DModel, width 512 (4 heads of 128), 1 double + 1 single block: 15 M params
    vae             AutoencoderKL, 4 levels (64, 128, 256, 256 channels, 16 M params), 16 latent channels: 8x as FLUX.1
    text encoders   the tiny pipeline's (CLIP width 16, T5 width 32, 1 layer each), tokenizers and scheduler

At 256 x 256 its transformer runs 256 image + 512 text tokens, and its VAE decode's activations
(64 channels at full resolution) are about as large as its weights: a generation whose peak depends on
both. `dtp fit`'s measured test and `benchmarks/fit_gpu_check.py` use it.
"""

from __future__ import annotations

import torch

from ..families import FAMILIES
from ..families.pipelines import FLUX_TRANSFORMER_CLASS, tiny_flux_pipeline
from .perturb import perturb

TINY = FAMILIES[FLUX_TRANSFORMER_CLASS].tiny  # the text encoders' widths: the tiny pipeline's are reused

MEDIUM_TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=128,
    num_attention_heads=4,
    joint_attention_dim=TINY["joint_attention_dim"],
    pooled_projection_dim=TINY["pooled_projection_dim"],
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
MEDIUM_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(64, 128, 256, 256),
    layers_per_block=1,
    latent_channels=16,
    norm_num_groups=32,
    sample_size=256,
    use_quant_conv=False,
    use_post_quant_conv=False,
    shift_factor=0.1159,
    scaling_factor=0.3611,
)


def medium_flux_pipeline(dtype: torch.dtype = torch.float32):
    """The medium FluxPipeline in memory, every component drawn from its own fixed seed."""
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

    tiny = tiny_flux_pipeline()
    torch.manual_seed(11)
    transformer = FluxTransformer2DModel(**MEDIUM_TRANSFORMER)
    torch.manual_seed(12)
    vae = AutoencoderKL(**MEDIUM_VAE)
    text = {n: tiny.components[n] for n in ("scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")}
    pipe = FluxPipeline(vae=perturb(vae, seed=12), transformer=perturb(transformer, seed=11).eval(), **text)
    return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)


def medium_checkpoint(directory) -> str:
    """The medium pipeline saved (safetensors, fp32) to `directory`, which is returned as a string."""
    medium_flux_pipeline().save_pretrained(directory, safe_serialization=True)
    return str(directory)
