"""HunyuanVideoTransformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side, text_mask

CLASS_NAME = "HunyuanVideoTransformer3DModel"
PLAN = "hunyuanvideo"

TINY = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=1,
    num_single_layers=2,
    num_refiner_layers=1,
    patch_size=2,
    patch_size_t=1,
    text_embed_dim=32,
    pooled_projection_dim=16,
    rope_axes_dim=(4, 6, 6),
    guidance_embeds=True,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_time_scale=4, clip=(129, 720, 1280), two_call_cfg=True, layout="video")


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], 1, s, s, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        guidance=torch.full((batch,), 3500.0),
        return_dict=False,
    )
