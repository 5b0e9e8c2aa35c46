"""Tiny VAEs with the real structure (several resolutions, mid-block attention, GroupNorm groups > 1)."""

from __future__ import annotations

import torch

# AutoencoderKL: 3 levels (factor 4), GroupNorm with 4 groups, mid-block attention over 16 channels.
TINY_VAE_CONFIGS = {
    "AutoencoderKL": dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        mid_block_add_attention=True,
    ),
    # FLUX.2's VAE: the same Encoder / Decoder (plus quant convs and a latent BatchNorm outside them).
    "AutoencoderKLFlux2": dict(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
    ),
    # Causal video VAEs: 3 levels (spatial factor 4), 2 temporal halvings (5 frames <-> 2 latent frames,
    # 9 <-> 3), RMS norms, mid-block attention per frame.
    "AutoencoderKLWan": dict(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ),
    # Wan 2.2's VAE (is_residual: AvgDown3D / DupUp3D shortcuts, patchify by 2 outside the encoder/decoder):
    # spatial factor 2 x 4, so a 7 x 6 latent decodes to 56 x 48.
    "AutoencoderKLWan22": dict(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[True, True],
        is_residual=True,
        patch_size=2,
        in_channels=12,
        out_channels=12,
        scale_factor_spatial=8,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ),
    # HunyuanVideo: 3 levels, 2 spatial and 2 temporal (causal) up/downsamplings (5 frames <-> 2, 9 <-> 3),
    # replicate-padded causal convs, GroupNorm 4 groups, mid-block attention over all frames (causal mask).
    "AutoencoderKLHunyuanVideo": dict(
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 3,
        up_block_types=("HunyuanVideoUpBlock3D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
        spatial_compression_ratio=4,
        temporal_compression_ratio=4,
    ),
    # LTX-Video 0.9.1-style: patch 2, two (T, H, W) stride-2 convs (spatial factor 8: 7 x 6 -> 56 x 48,
    # 5 frames <-> 2, 9 <-> 3), RMS norms, a non-causal decoder with timestep conditioning (decode(z, temb)).
    "AutoencoderKLLTXVideo": dict(
        latent_channels=4,
        block_out_channels=(8, 16, 16),
        decoder_block_out_channels=(16, 16, 16),  # equal widths: diffusers 0.42 up blocks with conv_in lose temb
        down_block_types=("LTXVideoDownBlock3D",) * 3,
        layers_per_block=(1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False),
        decoder_spatio_temporal_scaling=(True, True, False),
        decoder_inject_noise=(False,) * 4,
        upsample_residual=(False,) * 3,
        upsample_factor=(1,) * 3,
        timestep_conditioning=True,
        patch_size=2,
    ),
    # LTX-Video 0.9.5-style: space-to-depth LTXVideoDownsampler3d (spatial, temporal, 2 x spatiotemporal) and
    # residual depth-to-space LTXVideoUpsampler3d (upscale_factor 2): factor 2 x 8 in H (7 x 6 -> 112 x 96),
    # 8 in time (9 frames <-> 2 latent frames).
    "AutoencoderKLLTXVideo095": dict(
        latent_channels=4,
        block_out_channels=(8, 16, 16, 16, 16),
        decoder_block_out_channels=(8, 16, 32),
        down_block_types=("LTXVideo095DownBlock3D",) * 4,
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True,) * 4,
        decoder_spatio_temporal_scaling=(True,) * 3,
        decoder_inject_noise=(False,) * 4,
        downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
        upsample_residual=(True,) * 3,
        upsample_factor=(2,) * 3,
        patch_size=2,
    ),
    # LTX-2: patch 2, encoder space-to-depth downsamplers (spatial, temporal, spatiotemporal: 8 in H, 4 in time),
    # decoder residual depth-to-space upsamplers (spatiotemporal, temporal, spatial): 7 x 6 <-> 56 x 48, 5 frames
    # <-> 2, 9 <-> 3; zero-padded encoder convs, reflect-padded decoder convs (LTX-2's defaults), per-position RMS
    # norms, timestep conditioning (decode(z, temb)). Decoder widths halve per block: diffusers 0.42 up blocks with
    # a conv_in lose temb.
    "AutoencoderKLLTX2Video": dict(
        latent_channels=4,
        block_out_channels=(8, 16, 16),
        down_block_types=("LTX2VideoDownBlock3D",) * 3,
        layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True),
        downsample_type=("spatial", "temporal", "spatiotemporal"),
        decoder_block_out_channels=(8, 16, 32),
        decoder_layers_per_block=(1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True),
        upsample_type=("spatiotemporal", "temporal", "spatial"),
        decoder_inject_noise=(False,) * 4,
        upsample_residual=(True,) * 3,
        upsample_factor=(2, 2, 2),
        timestep_conditioning=True,
        patch_size=2,
    ),
    # HunyuanVideo 1.5: 3 levels, 2 space-to-depth / depth-to-space (x2 in H, W and time; 5 frames <-> 2, 9 <-> 3),
    # replicate-padded causal convs, RMS norms, a causal-over-frames mid-block attention.
    "AutoencoderKLHunyuanVideo15": dict(
        latent_channels=4,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        spatial_compression_ratio=4,
        temporal_compression_ratio=4,
    ),
    # Qwen-Image 2.1 (an image VAE: one frame): Wan 2.2's residual layout with 2-D causal convs, factor 4.
    "AutoencoderKLQwenImage21": dict(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        in_channels=3,
        out_channels=3,
        scale_factor_spatial=4,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ),
    # MiniMax-H3: a causal CNN encoder (reflect-padded convs, per-frame GroupNorm, 4x in space, 2x in time) and a
    # 2-block ViT decoder (2 heads of 16, RoPE over 12 of them, 2 register tokens); clip_length 5 with token_drop 1:
    # 5 latent frames decode to 8 frames (one clip), 5 frames encode to 2 latent frames.
    "AutoencoderKLMiniMaxH3": dict(
        latent_channels=4,
        block_out_channels=(8, 16),
        layers_per_block=1,
        spatial_downsample_factors=(2, 2),
        temporal_downsample_factors=(2, 1),
        norm_num_groups=4,
        decoder_num_layers=2,
        decoder_num_attention_heads=2,
        decoder_attention_head_dim=16,
        decoder_num_register_tokens=2,
        clip_length=5,
        token_drop=1,
        latents_mean=(0.0,) * 4,
        latents_std=(1.0,) * 4,
    ),
    # HunyuanImage 2.1: 2-D, 3 levels (factor 4, space-to-depth / depth-to-space), GroupNorm of 32 groups (fixed by
    # diffusers: widths are multiples of 32), single-head mid-block attention over all positions.
    "AutoencoderKLHunyuanImage": dict(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(32, 64, 64),
        layers_per_block=1,
        spatial_compression_ratio=4,
        sample_size=32,
    ),
}
# HunyuanImage 2.1's refiner VAE: HunyuanVideo 1.5's layout (an attention without the causal mask): the same config.
TINY_VAE_CONFIGS["AutoencoderKLHunyuanImageRefiner"] = dict(TINY_VAE_CONFIGS["AutoencoderKLHunyuanVideo15"])
# Qwen-Image's VAE is Wan 2.1's architecture under its own class: the same tiny configuration.
TINY_VAE_CONFIGS["AutoencoderKLQwenImage"] = dict(TINY_VAE_CONFIGS["AutoencoderKLWan"])
# Configs of one class under another name (a model version): key -> diffusers class.
CLASS_OF = {"AutoencoderKLWan22": "AutoencoderKLWan", "AutoencoderKLLTXVideo095": "AutoencoderKLLTXVideo"}

# DC-AE, the f32c32-in / mix layout (3 levels: factor 4, 7 x 6 -> 28 x 24): pixel (un)shuffle blocks, ResBlocks with
# BatchNorm2d in the decoder's upper levels, multiscale ReLU linear attention (5 x 5 projections) at the latent grid
# (42 tokens > head dim 8: the linear form).
TINY_VAE_CONFIGS["AutoencoderDC"] = dict(
    latent_channels=4,
    attention_head_dim=8,
    encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
    decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
    encoder_block_out_channels=(8, 16, 32),
    decoder_block_out_channels=(8, 16, 32),
    encoder_layers_per_block=(1, 1, 1),
    decoder_layers_per_block=(1, 1, 1),
    encoder_qkv_multiscales=((), (), (5,)),
    decoder_qkv_multiscales=((), (), (5,)),
    decoder_norm_types=("batch_norm", "batch_norm", "rms_norm"),
    decoder_act_fns=("relu", "relu", "silu"),
)
# DC-AE, Sana's layout (dc-ae-f32c32-sana-1.0): stride-2 conv downsampling, nearest-interpolation upsampling; here
# also DC blocks as the encoder's conv_in and the decoder's conv_out (layers_per_block[0] = 0, as f32c32-in),
# BatchNorm2d after the attention, and a head as wide as the latent grid's 42 tokens: diffusers' quadratic form
# (H W <= head dim 64).
TINY_VAE_CONFIGS["AutoencoderDCConv"] = dict(
    latent_channels=4,
    attention_head_dim=64,
    encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
    decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
    encoder_block_out_channels=(8, 16, 64),
    decoder_block_out_channels=(8, 16, 64),
    encoder_layers_per_block=(0, 1, 1),
    decoder_layers_per_block=(0, 1, 1),
    encoder_qkv_multiscales=((), (), (3,)),
    decoder_qkv_multiscales=((), (), (3,)),
    upsample_block_type="interpolate",
    downsample_block_type="conv",
    decoder_norm_types="batch_norm",
    decoder_act_fns="relu",
)
CLASS_OF["AutoencoderDCConv"] = "AutoencoderDC"
# CogVideoX: 3 levels (spatial factor 4: 7 x 6 -> 28 x 24), both downsamplings compress time (factor 4: 17 frames
# <-> 5 latent frames, two frame batches each way, so the conv caches carry over), spatial norms in the decoder.
TINY_VAE_CONFIGS["AutoencoderKLCogVideoX"] = dict(
    down_block_types=("CogVideoXDownBlock3D",) * 3,
    up_block_types=("CogVideoXUpBlock3D",) * 3,
    block_out_channels=(8, 16, 16),
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=4,
    temporal_compression_ratio=4,
)
# EasyAnimate's Magvit VAE: 3 levels (spatial factor 4: 7 x 6 -> 28 x 24), one spatial and one spatio-temporal
# down / upsampling (time factor 2: 9 frames <-> 5 latent frames), per-frame GroupNorm (spatial_group_norm).
TINY_VAE_CONFIGS["AutoencoderKLMagvit"] = dict(
    latent_channels=4,
    block_out_channels=(8, 16, 16),
    down_block_types=("SpatialDownBlock3D", "SpatialTemporalDownBlock3D", "SpatialTemporalDownBlock3D"),
    up_block_types=("SpatialUpBlock3D", "SpatialTemporalUpBlock3D", "SpatialTemporalUpBlock3D"),
    layers_per_block=1,
    norm_num_groups=4,
)

# Mochi: 3 levels (spatial factor 4: 7 x 6 -> 28 x 24; time 2: 3 latent frames -> 6, the first dropped: 5), replicate-
# padded causal convs, per-frame GroupNorm (32 groups, fixed by diffusers: widths are multiples of 32) and, in the
# encoder's down / mid blocks, attention over frames (heads of 32 channels).
TINY_VAE_CONFIGS["AutoencoderKLMochi"] = dict(
    encoder_block_out_channels=(32, 32, 32),
    decoder_block_out_channels=(32, 32, 32),
    latent_channels=4,
    layers_per_block=(1, 1, 1, 1),
    temporal_expansions=(1, 2),
    spatial_expansions=(2, 2),
    add_attention_block=(False, True, True, True),
    latents_mean=(0.0,) * 4,
    latents_std=(1.0,) * 4,
)
# Allegro: 3 levels (spatial factor 4), one temporal down / upsampling (time 2), GroupNorm 4 groups, a mid-block
# attention per frame. diffusers decodes and encodes it only tiled: `tiny_vae` sets tiles of 8 frames x 16 x 16
# pixels at a stride of 4 x 8 x 8 (4 latent frames x 4 x 4 at 2 x 2 x 2), as the released 24 x 320 x 320 tiles.
TINY_VAE_CONFIGS["AutoencoderKLAllegro"] = dict(
    block_out_channels=(8, 16, 16),
    down_block_types=("AllegroDownBlock3D",) * 3,
    up_block_types=("AllegroUpBlock3D",) * 3,
    temporal_downsample_blocks=(True, False, False),
    temporal_upsample_blocks=(False, True, False),
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=4,
    temporal_compression_ratio=2,
    sample_size=16,
)
ALLEGRO_TILES = dict(kernel=(8, 16, 16), stride=(4, 8, 8))
# Cosmos 1: Haar patching by 2, then 2 spatial downsamplings (factor 8: 7 x 6 -> 56 x 48) and 1 temporal (time 4:
# 2 latent frames <-> 5 frames), per-frame GroupNorm (1 group), spatial and temporal attention in the mid blocks and at
# the 8-pixel resolution.
TINY_VAE_CONFIGS["AutoencoderKLCosmos"] = dict(
    latent_channels=4,
    encoder_block_out_channels=(8, 16, 16, 16),
    decode_block_out_channels=(16, 16, 16, 16),
    attention_resolutions=(8,),
    resolution=32,
    num_layers=1,
    patch_size=2,
    spatial_compression_ratio=8,
    temporal_compression_ratio=4,
    latents_mean=None,
    latents_std=None,
)


def tiny_vae(cls: str, seed: int = 0):
    """A random-weight VAE of config `cls` from TINY_VAE_CONFIGS, weights ~ N(0, 0.2) from `seed`, fp32, eval."""
    import diffusers

    torch.manual_seed(seed)
    vae = getattr(diffusers, CLASS_OF.get(cls, cls))(**TINY_VAE_CONFIGS[cls]).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.normal_(0, 0.2)
    if cls == "AutoencoderKLAllegro":
        vae.enable_tiling()  # its only decode / encode
        vae.kernel, vae.stride = ALLEGRO_TILES["kernel"], ALLEGRO_TILES["stride"]
    return vae
