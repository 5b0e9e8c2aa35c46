"""CosmosTransformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "CosmosTransformer3DModel"
PLAN = "cosmos"

TINY = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=2,
    text_embed_dim=32,
    adaln_lora_dim=8,
    max_size=(4, 16, 16),
    patch_size=(1, 2, 2),
    concat_padding_mask=False,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_time_scale=8, clip=(121, 704, 1280), layout="video")


def inputs(cfg, g, batch, img, txt):
    f, h, w = video_grid(img)
    pt, ph, pw = cfg["patch_size"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f * pt, h * ph, w * pw, generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        return_dict=False,
    )
