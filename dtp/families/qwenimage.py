"""QwenImageTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry

CLASS_NAME = "QwenImageTransformer2DModel"
PLAN = "qwenimage"

TINY = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    axes_dims_rope=(4, 6, 6),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(two_call_cfg=True)  # true CFG: a conditional and an unconditional call per step


def inputs(cfg, g, batch, img, txt):
    side = int(img**0.5)
    assert side * side == img, "Qwen-Image tiny inputs need a square number of image tokens"
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        encoder_hidden_states_mask=torch.ones(batch, txt, dtype=torch.long),
        timestep=torch.rand(batch, generator=g),
        img_shapes=[[(1, side, side)]] * batch,
        return_dict=False,
    )
