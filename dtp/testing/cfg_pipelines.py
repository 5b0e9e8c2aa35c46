"""Tiny random-weight pipelines for the cfg axis, in memory: PixArt-Sigma (one call on a doubled batch)
and Wan 2.1 text-to-video (two calls per step). Qwen-Image (two calls with true_cfg_scale) is in
`dtp.families.pipelines`.

    PixArtSigmaPipeline  PixArtTransformer2DModel (dtp.tiny's config: 4 heads of 16, 2 blocks, learned
                         sigma), AutoencoderKL (8, 16 channels: 32 x 32 pixels <-> 4 x 16 x 16 latents),
                         T5 encoder of width 32, DPM-Solver scheduler
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

PIXART_CALL = dict(height=32, width=32, use_resolution_binning=False, max_sequence_length=16, clean_caption=False)
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
