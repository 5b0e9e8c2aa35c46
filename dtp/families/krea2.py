"""Krea2Transformer2DModel family (Krea 2): single-stream blocks over [text, image] with grouped-query attention and a
sigmoid output gate; a small text-fusion transformer first collapses a stack of tapped text-encoder layers."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "Krea2Transformer2DModel"
PLAN = "krea2"

# 8 q / 4 kv heads of 16 (GQA as the released 48 / 12; tp 1, 2, 4); the text fusion 4 heads of 8 over 3 tapped layers.
TINY = dict(
    in_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=8,
    num_key_value_heads=4,
    intermediate_size=128,
    timestep_embed_dim=32,
    text_hidden_dim=32,
    num_text_layers=3,
    text_num_attention_heads=4,
    text_num_key_value_heads=4,
    text_intermediate_size=64,
    num_layerwise_text_blocks=1,
    num_refiner_text_blocks=1,
    axes_dims_rope=(4, 6, 6),
)

RELEASED: dict = {}  # the class defaults are Krea 2's config according to the class docstring (no hub here to check)


def inputs(cfg, g, batch, img, txt):
    """Packed latents, the tapped text layers ([batch, txt, layers, width]) with their bool mask (sample 1 padded),
    a time in [0, 1], and (t, h, w) RoPE ids for [text (zeros), image (the latent grid)]."""
    side = square_side(img)
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
    ids = torch.cat([torch.zeros(txt, 3), torch.cat([torch.zeros(img, 1), grid.float()], dim=1)])
    layers, width = cfg.get("num_text_layers", 12), cfg.get("text_hidden_dim", 2560)
    return dict(
        hidden_states=torch.randn(batch, img, cfg.get("in_channels", 64), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, layers, width, generator=g),
        timestep=torch.rand(batch, generator=g),
        position_ids=ids,
        encoder_attention_mask=text_mask(batch, txt).bool(),
        return_dict=False,
    )
