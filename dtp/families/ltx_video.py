"""LTXVideoTransformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask, video_grid

CLASS_NAME = "LTXVideoTransformer3DModel"
PLAN = "ltx_video"

TINY = dict(
    in_channels=8,
    out_channels=8,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=4,
    attention_head_dim=16,
    cross_attention_dim=64,
    num_layers=2,
    caption_channels=32,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_scale=32, patch=1, vae_time_scale=8, clip=(161, 480, 704), layout="video_tokens")


def inputs(cfg, g, batch, img, txt):
    f, h, w = video_grid(img)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        num_frames=f,
        height=h,
        width=w,
        return_dict=False,
    )
