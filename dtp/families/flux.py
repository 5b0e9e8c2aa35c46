"""FluxTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

CLASS_NAME = "FluxTransformer2DModel"
PLAN = "flux"

TINY = dict(
    patch_size=1,
    in_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    pooled_projection_dim=16,
    guidance_embeds=False,
    axes_dims_rope=(4, 6, 6),
)

RELEASED = {"guidance_embeds": True}


def inputs(cfg, g, batch, img, txt):
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_ids=torch.randint(0, 8, (img, 3), generator=g).float(),
        txt_ids=torch.zeros(txt, 3),
        return_dict=False,
    )
