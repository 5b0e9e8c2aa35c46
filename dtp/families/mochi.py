"""MochiTransformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask, video_grid

CLASS_NAME = "MochiTransformer3DModel"
PLAN = "mochi"

TINY = dict(
    patch_size=2,
    num_attention_heads=4,
    attention_head_dim=24,
    num_layers=2,
    pooled_projection_dim=24,
    in_channels=4,
    text_embed_dim=32,
    time_embed_dim=16,
    max_sequence_length=8,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_time_scale=6, clip=(163, 480, 848), layout="video")


def inputs(cfg, g, batch, img, txt):
    f, h, w = video_grid(img)
    p = cfg["patch_size"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h * p, w * p, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        return_dict=False,
    )
