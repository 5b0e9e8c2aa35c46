"""DiTTransformer2DModel family (DiT, Peebles & Xie): class-conditional BasicTransformerBlocks with AdaLN-Zero,
each block carrying its own timestep + class-label embedder."""

from __future__ import annotations

import torch

from .shapes import square_side

CLASS_NAME = "DiTTransformer2DModel"
PLAN = "dit"

# 4 heads of 16 (tp 1, 2, 4); 8 classes (+ the CFG null class: the table has 9 rows).
TINY = dict(
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    sample_size=8,
    patch_size=2,
    num_embeds_ada_norm=8,
)

# DiT-XL-2-256 (facebook/DiT-XL-2-256): the class defaults (28 blocks of 16 heads x 72, 1000 ImageNet classes) and
# a learned-sigma output (8 channels).
RELEASED = {"out_channels": 8}


def inputs(cfg, g, batch, img, txt):
    """Latents, timesteps and class labels; the last sample takes the null class (CFG's unconditional half)."""
    s = square_side(img, cfg.get("patch_size", 2))
    classes = cfg.get("num_embeds_ada_norm", 1000)
    labels = torch.randint(0, classes, (batch,), generator=g)
    labels[-1] = classes  # the null class, row `classes` of the table
    return dict(
        hidden_states=torch.randn(batch, cfg.get("in_channels", 4), s, s, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        class_labels=labels,
        return_dict=False,
    )
