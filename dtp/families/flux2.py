"""Flux2Transformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

CLASS_NAME = "Flux2Transformer2DModel"
PLAN = "flux2"

TINY = dict(
    patch_size=1,
    in_channels=16,
    num_layers=1,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    timestep_guidance_channels=32,
    mlp_ratio=3.0,
    axes_dims_rope=(4, 4, 4, 4),
    guidance_embeds=True,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


def inputs(cfg, g, batch, img, txt):
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        guidance=torch.full((batch,), 3.5),
        img_ids=torch.randint(0, 8, (batch, img, 4), generator=g).float(),
        txt_ids=torch.zeros(batch, txt, 4),
        return_dict=False,
    )
