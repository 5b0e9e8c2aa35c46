"""LTX2VideoTransformer3DModel family (LTX-2, audio + video): forward inputs, tiny test config, released overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask, video_grid

CLASS_NAME = "LTX2VideoTransformer3DModel"
PLAN = "ltx2"

# Video (4 heads of 16) and audio (4 heads of 8) streams, their cross-modal attentions; tp 1, 2, 4.
TINY = dict(
    in_channels=8,
    out_channels=8,
    num_attention_heads=4,
    attention_head_dim=16,
    cross_attention_dim=64,
    audio_in_channels=8,
    audio_out_channels=8,
    audio_num_attention_heads=4,
    audio_attention_head_dim=8,
    audio_cross_attention_dim=32,
    num_layers=2,
    caption_channels=32,
)

RELEASED: dict = {}  # the diffusers class defaults are LTX-2's released config

# LTX-2's video VAE as LTX-Video's (32x, 8x in time, patch 1); audio tokens stay as the family builds them
GEOMETRY = Geometry(vae_scale=32, patch=1, vae_time_scale=8, clip=(121, 512, 768), layout="video_tokens")

AUDIO_FRAMES = 8  # audio latent frames in the tiny inputs


def inputs(cfg, g, batch, img, txt):
    """Video and audio latents (token-major), one text prompt for both (sample 1 right-padded)."""
    f, h, w = video_grid(img)
    mask = text_mask(batch, txt)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        audio_hidden_states=torch.randn(batch, AUDIO_FRAMES, cfg["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        audio_encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=mask,
        audio_encoder_attention_mask=mask,
        num_frames=f,
        height=h,
        width=w,
        audio_num_frames=AUDIO_FRAMES,
        return_dict=False,
    )
