"""Flux3Transformer2DModel family (FLUX.3): forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

CLASS_NAME = "Flux3Transformer2DModel"
PLAN = "flux3"

# Every structural feature: per-mode blocks for the text, the image and a reference image (image_cond), joint
# single-stream blocks, four RoPE axes, SwiGLU feed-forwards; 4 heads of 16 (tp 1, 2, 4).
TINY = dict(
    in_channels=16,
    cond_in_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    timestep_channels=32,
    axes_dims_rope=(4, 4, 4, 4),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


def inputs(cfg, g, batch, img, txt):
    """Image tokens, text tokens and a reference image of img // 2 tokens (so the image_cond blocks run)."""
    cond = max(img // 2, 1)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_ids=torch.randint(0, 8, (img, 4), generator=g).float(),
        txt_ids=torch.zeros(txt, 4),
        image_cond_hidden_states=torch.randn(batch, cond, cfg["cond_in_channels"], generator=g),
        image_cond_ids=torch.randint(0, 8, (cond, 4), generator=g).float(),
        return_dict=False,
    )
