"""SD3Transformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .shapes import square_side

CLASS_NAME = "SD3Transformer2DModel"
PLAN = "sd3"

TINY = dict(
    sample_size=8,
    patch_size=2,
    in_channels=4,
    num_layers=3,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    caption_projection_dim=64,
    pooled_projection_dim=16,
    out_channels=4,
    pos_embed_max_size=16,
    dual_attention_layers=(0,),
    qk_norm="rms_norm",
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        return_dict=False,
    )
