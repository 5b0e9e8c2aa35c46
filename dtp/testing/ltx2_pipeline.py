"""A tiny random-weight LTX2Pipeline in memory (video + audio): up to four transformer passes per denoising step.

    LTX2Pipeline   LTX2VideoTransformer3DModel (dtp.families.ltx2's tiny config: video 4 heads of 16, audio 4 heads
                   of 8, 2 blocks), LTX2TextConnectors (1 block each, width 32), AutoencoderKLLTX2Video
                   (`VIDEO_VAE`, 8 latent channels: 9 x 32 x 32 pixels <-> 3 x 4 x 4 latents, 48 video tokens),
                   AutoencoderKLLTX2Audio (8 mel bins), LTX2Vocoder, a 2-layer Gemma 3 text encoder of
                   width 32 and the byte-level tokenizer of the tiny Qwen-Image pipeline (one token per byte),
                   flow-matching scheduler

Every weight is drawn from a fixed seed and perturbed (`perturb`), the same on every rank. With `LTX2_CALL` and the
guidance of `LTX2_GUIDANCE` a step makes the four passes of diffusers 0.42.1's LTX-2 loop:

    call 0  cache_context("cond_uncond")      batch 2: cat([uncond, cond])   (classifier-free guidance)
    call 1  cache_context("uncond_stg")       batch 1: STG blocks perturbed  (spatio-temporal guidance)
    call 2  cache_context("uncond_modality")  batch 1: isolate_modalities    (modality guidance)
"""

from __future__ import annotations

import torch

from ..families.ltx2 import TINY
from .perturb import perturb
from .tiny import tiny_model
from .tiny_text import tiny_text_model

TRANSFORMER_CLASS = "LTX2VideoTransformer3DModel"
# Two spatio-temporal levels and 2 x 2 patches: x8 in height and width, x4 in time, both ways (the ratios the
# pipeline reads from the config are the ones the decoder undoes: 9 x 32 x 32 pixels <-> 3 x 4 x 4 latents).
VIDEO_VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=TINY["in_channels"],
    block_out_channels=(8, 16),
    down_block_types=("LTX2VideoDownBlock3D",) * 2,
    layers_per_block=(1, 1, 1),
    spatio_temporal_scaling=(True, True),
    downsample_type=("spatiotemporal", "spatiotemporal"),
    decoder_block_out_channels=(8, 16),
    decoder_layers_per_block=(1, 1, 1),
    decoder_spatio_temporal_scaling=(True, True),
    upsample_type=("spatiotemporal", "spatiotemporal"),
    decoder_inject_noise=(False,) * 3,
    upsample_residual=(False, False),
    upsample_factor=(1, 1),
    timestep_conditioning=False,
    patch_size=2,
    patch_size_t=1,
    encoder_causal=True,
    decoder_causal=False,
)
MEL_BINS = 8
# 9 frames of 32 x 32 pixels at 25 fps, prompts of 16 tokens; sizes the tiny VAEs take.
LTX2_CALL = dict(height=32, width=32, num_frames=9, frame_rate=25.0, max_sequence_length=16, use_cross_timestep=False)
# The four passes: classifier-free, spatio-temporal (block 1 perturbed) and modality guidance, no rescale.
LTX2_GUIDANCE = dict(
    guidance_scale=3.0,
    stg_scale=1.0,
    modality_scale=3.0,
    guidance_rescale=0.0,
    audio_guidance_scale=7.0,
    audio_stg_scale=1.0,
    audio_modality_scale=3.0,
    audio_guidance_rescale=0.0,
    spatio_temporal_guidance_blocks=[1],
)


CONNECTORS = dict(  # besides the text encoder's width and depth
    video_connector_num_attention_heads=4,
    video_connector_attention_head_dim=8,
    video_connector_num_layers=1,
    video_connector_num_learnable_registers=None,
    audio_connector_num_attention_heads=4,
    audio_connector_attention_head_dim=8,
    audio_connector_num_layers=1,
    audio_connector_num_learnable_registers=None,
    connector_rope_base_seq_len=32,
    rope_theta=10000.0,
    rope_double_precision=False,
    causal_temporal_positioning=False,
    rope_type="split",
)

AUDIO_VAE = dict(
    base_channels=TINY["audio_in_channels"],  # the size of its latents_mean / std: the packed audio channels
    output_channels=2,
    ch_mult=(1,),
    num_res_blocks=1,
    attn_resolutions=None,
    in_channels=2,
    resolution=32,
    latent_channels=TINY["audio_in_channels"] // (MEL_BINS // 4),
    norm_type="pixel",
    causality_axis="height",
    dropout=0.0,
    mid_block_add_attention=False,
    sample_rate=16000,
    mel_hop_length=160,
    is_causal=True,
    mel_bins=MEL_BINS,
)

VOCODER = dict(
    in_channels=2 * MEL_BINS,
    hidden_channels=32,
    out_channels=2,
    upsample_kernel_sizes=[4, 4],
    upsample_factors=[2, 2],
    resnet_kernel_sizes=[3],
    resnet_dilations=[[1, 3, 5]],
    leaky_relu_negative_slope=0.1,
    output_sampling_rate=16000,
)


def tiny_ltx2_pipeline():
    """The tiny LTX2Pipeline (see the module docstring)."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from ..families.pipelines import qwen_tokenizer

    tokenizer = qwen_tokenizer()
    text_encoder = tiny_text_model("Gemma3ForConditionalGeneration", seed=2, vocab_size=-(-len(tokenizer) // 8) * 8)
    text = text_encoder.config.text_config
    assert text.hidden_size == TINY["caption_channels"], "the connectors take the text encoder's width"
    torch.manual_seed(3)
    connectors = LTX2TextConnectors(
        caption_channels=text.hidden_size, text_proj_in_factor=text.num_hidden_layers + 1, **CONNECTORS
    )
    assert TINY["cross_attention_dim"] == 64 and TINY["audio_cross_attention_dim"] == 32
    torch.manual_seed(1)
    vae = AutoencoderKLLTX2Video(**VIDEO_VAE)
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    torch.manual_seed(4)
    audio_vae = AutoencoderKLLTX2Audio(**AUDIO_VAE)
    torch.manual_seed(5)
    vocoder = LTX2Vocoder(**VOCODER)
    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=perturb(vae, seed=1),
        audio_vae=perturb(audio_vae, seed=4),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        connectors=perturb(connectors, seed=3),
        transformer=tiny_model(TRANSFORMER_CLASS, seed=0),
        vocoder=perturb(vocoder, seed=5),
    )
