"""OvisImageTransformer2DModel family (Ovis-Image): forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

CLASS_NAME = "OvisImageTransformer2DModel"
PLAN = "ovisimage"

TINY = dict(
    patch_size=1,
    in_channels=16,
    out_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    axes_dims_rope=(4, 6, 6),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


def inputs(cfg, g, batch, img, txt):
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_ids=torch.randint(0, 8, (img, 3), generator=g).float(),
        txt_ids=torch.zeros(txt, 3),
        return_dict=False,
    )
