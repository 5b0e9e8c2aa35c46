"""CogView4Transformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side

CLASS_NAME = "CogView4Transformer2DModel"
PLAN = "cogview4"

TINY = dict(
    patch_size=2,
    in_channels=4,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    text_embed_dim=32,
    time_embed_dim=16,
    condition_dim=8,
    pos_embed_max_size=16,
    sample_size=8,
    rope_axes_dim=(8, 8),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(two_call_cfg=True)


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    size = torch.tensor([[s * 8, s * 8]] * batch, dtype=torch.float32)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        original_size=size,
        target_size=size,
        crop_coords=torch.zeros(batch, 2),
        return_dict=False,
    )
