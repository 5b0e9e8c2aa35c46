"""GlmImageTransformer2DModel family (GLM-Image's diffusion decoder): CogView4's blocks over [glyph text, image]
tokens, the image tokens carrying the autoregressive prior's tokens (an embedding table and an MLP)."""

from __future__ import annotations

import torch

from . import cogview4
from .geometry import Geometry
from .shapes import square_side

CLASS_NAME = "GlmImageTransformer2DModel"
PLAN = "glm_image"

# CogView4's tiny widths (4 heads of 16, 2 blocks) and a 64-entry prior codebook.
TINY = dict(
    {k: cogview4.TINY[k] for k in ("patch_size", "in_channels", "out_channels", "num_layers")},
    **{k: cogview4.TINY[k] for k in ("attention_head_dim", "num_attention_heads", "text_embed_dim")},
    time_embed_dim=16,
    condition_dim=8,
    prior_vq_quantizer_codebook_size=64,
)

# Assumed widths: the class defaults (30 blocks of 64 heads x 40, ByT5's 1472-wide glyph features, a 16384-entry
# prior codebook); not checked against the released checkpoint's config (no hub here).
RELEASED: dict = {}
GEOMETRY = Geometry(two_call_cfg=True)  # the pipeline runs the conditional and unconditional calls one after another


def inputs(cfg, g, batch, img, txt):
    """Latents, glyph text features (no mask: the pipeline passes none, its glyph embeddings are unpadded), one
    prior token per image token (dropped for the last sample, as in the pipeline's unconditional call), size and
    crop conditioning."""
    s = square_side(img, cfg.get("patch_size", 2))
    drop = torch.zeros(batch, img, dtype=torch.bool)
    drop[-1] = True
    size = torch.tensor([[s * 8, s * 8]] * batch, dtype=torch.float32)
    return dict(
        hidden_states=torch.randn(batch, cfg.get("in_channels", 16), s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg.get("text_embed_dim", 1472), generator=g),
        prior_token_id=torch.randint(0, cfg.get("prior_vq_quantizer_codebook_size", 16384), (batch, img), generator=g),
        prior_token_drop=drop,
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        target_size=size,
        crop_coords=torch.zeros(batch, 2),
        return_dict=False,
    )
