"""Lumina2Transformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side, text_mask

CLASS_NAME = "Lumina2Transformer2DModel"
PLAN = "lumina2"

# 8 q / 4 kv heads of 8 (GQA; tp 1, 2, 4, 8: at tp 8 each kv head is shared by 2 ranks).
TINY = dict(
    sample_size=8,
    patch_size=2,
    in_channels=4,
    hidden_size=64,
    num_layers=2,
    num_refiner_layers=1,
    num_attention_heads=8,
    num_kv_heads=4,
    multiple_of=16,
    axes_dim_rope=(2, 2, 4),
    axes_lens=(32, 32, 32),
    cap_feat_dim=32,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(two_call_cfg=True)


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["cap_feat_dim"], generator=g),
        encoder_attention_mask=text_mask(batch, txt).bool(),
        return_dict=False,
    )
