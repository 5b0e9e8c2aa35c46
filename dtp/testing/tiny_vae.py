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
    "AutoencoderKLQwenImage": dict(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ),
}


def tiny_vae(cls: str, seed: int = 0):
    """A random-weight VAE of class `cls` from TINY_VAE_CONFIGS, weights ~ N(0, 0.2) from `seed`, fp32, eval."""
    import diffusers

    torch.manual_seed(seed)
    vae = getattr(diffusers, cls)(**TINY_VAE_CONFIGS[cls]).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.normal_(0, 0.2)
    return vae
