"""QwenImage21Transformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "QwenImage21Transformer2DModel"
PLAN = "qwenimage21"

TINY = dict(
    patch_size=1,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    context_in_dim=32,
    axes_dims_rope=(4, 6, 6),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


def inputs(cfg, g, batch, img, txt):
    side = square_side(img)
    slots = img // 4
    img_mask = torch.cat([torch.zeros(batch, txt, dtype=torch.bool), torch.ones(batch, slots, dtype=torch.bool)], 1)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["context_in_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_shapes=[[(1, side, side)]] * batch,
        img_mask=img_mask,
        encoder_hidden_states_mask=text_mask(batch, txt).bool(),
        return_dict=False,
    )
