"""HunyuanImageTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side, text_mask

CLASS_NAME = "HunyuanImageTransformer2DModel"
PLAN = "hunyuanimage"

TINY = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=1,
    num_single_layers=2,
    num_refiner_layers=1,
    patch_size=(1, 1),
    text_embed_dim=32,
    rope_axes_dim=(8, 8),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_scale=32, patch=1)  # HunyuanImage 2.1's 32x VAE, patch 1


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"][0])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g).float(),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        return_dict=False,
    )
