"""LongCatImageTransformer2DModel family (LongCat-Image: FLUX.1 layout, no pooled projection)."""

from __future__ import annotations

import torch

from . import flux

CLASS_NAME = "LongCatImageTransformer2DModel"
PLAN = "longcat_image"

TINY = {k: v for k, v in flux.TINY.items() if k not in ("pooled_projection_dim", "guidance_embeds")}

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
