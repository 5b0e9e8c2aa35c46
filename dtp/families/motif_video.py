"""MotifVideoTransformer3DModel family (Motif-Video): HunyuanVideo-style dual-stream then single-stream blocks over
[video | text], optional text cross-attention, and single-stream "decoder" blocks at the end that attend from a copy
of the embedded latents to the encoded video."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask, video_grid

CLASS_NAME = "MotifVideoTransformer3DModel"
PLAN = "motif_video"

RELEASED: dict = {}  # the class defaults (no hub here: not checked against the released config)
TINY = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=1,
    num_single_layers=2,
    num_decoder_layers=1,  # the last single block is a decoder block
    text_embed_dim=32,
    rope_axes_dim=(4, 6, 6),
    enable_text_cross_attention_dual=True,  # the dual block's text cross-attention (planned, optional)
)
# Wan 2.1's VAE geometry (16 latent channels, 4x in time, 8x in space: assumed from out_channels 16 and the class's
# patch sizes); 121 frames of 720 x 1280 px assumed; CFG on a doubled batch assumed.
GEOMETRY = Geometry(vae_time_scale=4, clip=(121, 720, 1280), layout="video")


def inputs(cfg, g, batch, img, txt):
    """Latents [B, C, F, H, W] and a text prompt with its mask (sample 1 padded)."""
    f, h, w = video_grid(img)
    p = cfg.get("patch_size", 2)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h * p, w * p, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        return_dict=False,
    )
