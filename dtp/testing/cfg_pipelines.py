"""Tiny random-weight pipelines for the cfg axis, in memory: PixArt-Sigma, LTX-Video and CogVideoX (one call on a
doubled batch; LTX's and CogVideoX's transformers have diffusers' CacheMixin, PixArt's does not) and Wan 2.1
text-to-video (two calls per step). Qwen-Image (two calls with true_cfg_scale) is in `dtp.families.pipelines`.

    PixArtSigmaPipeline  PixArtTransformer2DModel (dtp.tiny's config: 4 heads of 16, 2 blocks, learned
                         sigma), AutoencoderKL (8, 16 channels: 32 x 32 pixels <-> 4 x 16 x 16 latents),
                         T5 encoder of width 32, DPM-Solver scheduler
    LTXPipeline          LTXVideoTransformer3DModel (4 heads of 16, 2 blocks, patch 1), AutoencoderKLLTXVideo
                         (dtp.testing.tiny_vae's, 8 latent channels: 9 x 32 x 32 pixels <-> 3 x 4 x 4 latents,
                         48 tokens), T5 encoder of width 32, flow-matching scheduler
    CogVideoXPipeline    CogVideoXTransformer3DModel (4 heads of 16, 2 blocks, patch 2, 8 text tokens),
                         AutoencoderKLCogVideoX (8, 16, 16 channels: 5 x 32 x 32 pixels <-> 2 x 4 x 8 x 8 latents,
                         32 video tokens; its output is 5-D, the layout FasterCache's FFT expects), T5 of width 32
    WanPipeline          WanTransformer3DModel (4 heads of 16, 2 blocks), AutoencoderKLWan (8, 16 channels,
                         z 4, no temporal downsampling), UMT5 encoder of width 32, flow-matching scheduler

Call them with the matching `*_CALL` arguments (small sizes; PixArt without resolution binning, which
only knows the released sample sizes). Every weight is drawn from a fixed seed, the same on every rank.
"""

from __future__ import annotations

import torch

from ..families.pipelines import t5_encoder, t5_tokenizer
from .perturb import perturb
from .tiny import TINY_CONFIGS, tiny_model
from .tiny_vae import TINY_VAE_CONFIGS

PIXART_CALL = dict(height=32, width=32, use_resolution_binning=False, max_sequence_length=16, clean_caption=False)
LTX_CALL = dict(height=32, width=32, num_frames=9, max_sequence_length=16, decode_timestep=0.0, decode_noise_scale=None)
COGVIDEOX_CALL = dict(height=32, width=32, num_frames=5, max_sequence_length=8)
WAN_CALL = dict(height=16, width=16, num_frames=5, max_sequence_length=16)


def tiny_pixart_sigma_pipeline():
    """The tiny PixArtSigmaPipeline: classifier-free guidance as one transformer call on cat([uncond, cond])."""
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtSigmaPipeline
    from transformers import T5EncoderModel

    cfg = TINY_CONFIGS["PixArtTransformer2DModel"]
    torch.manual_seed(1)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=cfg["in_channels"],
        norm_num_groups=4,
        sample_size=32,
    )
    return PixArtSigmaPipeline(
        tokenizer=t5_tokenizer(),
        text_encoder=perturb(t5_encoder(cfg["caption_channels"], seed=2, model_class=T5EncoderModel), seed=2),
        vae=perturb(vae, seed=1),
        transformer=tiny_model("PixArtTransformer2DModel", seed=0),
        scheduler=DPMSolverMultistepScheduler(),
    )


def tiny_ltx_pipeline():
    """The tiny LTXPipeline: classifier-free guidance as one transformer call on cat([uncond, cond])."""
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline
    from transformers import T5EncoderModel

    cfg = TINY_CONFIGS["LTXVideoTransformer3DModel"]
    torch.manual_seed(1)
    vae = AutoencoderKLLTXVideo(**{**TINY_VAE_CONFIGS["AutoencoderKLLTXVideo"], "latent_channels": cfg["in_channels"]})
    return LTXPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=perturb(vae, seed=1),
        text_encoder=perturb(t5_encoder(cfg["caption_channels"], seed=2, model_class=T5EncoderModel), seed=2),
        tokenizer=t5_tokenizer(),
        transformer=tiny_model("LTXVideoTransformer3DModel", seed=0),
    )


def tiny_cogvideox_pipeline():
    """The tiny CogVideoXPipeline: classifier-free guidance as one transformer call on cat([uncond, cond])."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline
    from transformers import T5EncoderModel

    cfg = TINY_CONFIGS["CogVideoXTransformer3DModel"]
    torch.manual_seed(1)
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * 3,
        up_block_types=("CogVideoXUpBlock3D",) * 3,
        block_out_channels=(8, 16, 16),
        latent_channels=cfg["in_channels"],
        layers_per_block=1,
        norm_num_groups=4,
        sample_height=32,
        sample_width=32,
    )
    return CogVideoXPipeline(
        tokenizer=t5_tokenizer(),
        text_encoder=perturb(t5_encoder(cfg["text_embed_dim"], seed=2, model_class=T5EncoderModel), seed=2),
        vae=perturb(vae, seed=1),
        transformer=tiny_model("CogVideoXTransformer3DModel", seed=0),
        scheduler=CogVideoXDDIMScheduler(),
    )


def tiny_wan_pipeline():
    """The tiny WanPipeline (text to video): classifier-free guidance as two transformer calls per step."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import UMT5EncoderModel

    cfg = TINY_CONFIGS["WanTransformer3DModel"]
    torch.manual_seed(1)
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=cfg["in_channels"],
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[False],
        latents_mean=[0.0] * cfg["in_channels"],
        latents_std=[1.0] * cfg["in_channels"],
        scale_factor_temporal=1,  # the pipeline sizes latents by these: 5 frames of 8 x 8 for 5 x 16 x 16 pixels
        scale_factor_spatial=2,
    )
    return WanPipeline(
        tokenizer=t5_tokenizer(),
        text_encoder=perturb(t5_encoder(cfg["text_dim"], seed=2, model_class=UMT5EncoderModel), seed=2),
        vae=perturb(vae, seed=1),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=tiny_model("WanTransformer3DModel", seed=0),
    )
