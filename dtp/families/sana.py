"""SanaTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side, text_mask

CLASS_NAME = "SanaTransformer2DModel"
PLAN = "sana"

TINY = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=2,
    num_cross_attention_heads=4,
    cross_attention_head_dim=16,
    cross_attention_dim=64,
    caption_channels=32,
    sample_size=8,
    patch_size=1,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_scale=32, patch=1)  # DC-AE 32x, patch 1


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        return_dict=False,
    )
