"""BriaFiboTransformer2DModel family (Bria FIBO): FLUX.1's layout (Bria 3.2's inputs) where every block's text stream
is half the running text state and half a per-block projection of one text-encoder layer."""

from __future__ import annotations

import torch

from . import bria

CLASS_NAME = "BriaFiboTransformer2DModel"
PLAN = "bria_fibo"

# Bria 3.2's tiny widths (FLUX.1's: 4 heads of 16, 2 + 2 blocks) and a 24-wide text encoder.
TINY = {**bria.TINY, "text_encoder_dim": 24}

# Assumed widths: the class defaults (19 + 38 blocks of 24 heads x 128, SmolLM3's 2048-wide layers); not checked
# against the released checkpoint's config (no hub here). Only x_embedder's input width would differ if the
# checkpoint takes 48-channel Wan latents.
RELEASED: dict = {}


def inputs(cfg, g, batch, img, txt):
    """Bria's inputs and one text-encoder layer per block ([batch, txt, text_encoder_dim] each)."""
    layers = cfg.get("num_layers", 19) + cfg.get("num_single_layers", 38)
    width = cfg.get("text_encoder_dim", 2048)
    return dict(
        bria.inputs(cfg, g, batch, img, txt),
        text_encoder_layers=[torch.randn(batch, txt, width, generator=g) for _ in range(layers)],
    )
