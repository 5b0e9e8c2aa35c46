"""PRXTransformer2DModel family (Photoroom PRX): image-token blocks whose attention takes its keys from [text, image]
(fused image q/k/v and text k/v projections), the text stream read but never updated."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "PRXTransformer2DModel"
PLAN = "prx"

# 4 heads of 16 (tp 1, 2, 4); 2-axis RoPE (h, w) of 8 + 8 = head_dim.
TINY = dict(
    in_channels=4,
    patch_size=2,
    context_in_dim=32,
    hidden_size=64,
    mlp_ratio=2.0,
    num_heads=4,
    depth=2,
    axes_dim=[8, 8],
)

RELEASED: dict = {}  # the class defaults (16 blocks of 28 heads x 64) according to the class; no hub here to check


def inputs(cfg, g, batch, img, txt):
    """Latents, a timestep, the text features and their bool mask (sample 1 padded)."""
    s = square_side(img, cfg.get("patch_size", 2))
    return dict(
        hidden_states=torch.randn(batch, cfg.get("in_channels", 16), s, s, generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg.get("context_in_dim", 2304), generator=g),
        attention_mask=text_mask(batch, txt).bool(),
        return_dict=False,
    )
