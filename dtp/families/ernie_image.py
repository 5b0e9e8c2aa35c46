"""ErnieImageTransformer2DModel family (ERNIE-Image): single-stream blocks over [image, text] tokens, sequence-first
([S, B, H]), one shared AdaLN modulation expanded to every token."""

from __future__ import annotations

import torch

from .shapes import square_side

CLASS_NAME = "ErnieImageTransformer2DModel"
PLAN = "ernie_image"

# 4 heads of 16 (tp 1, 2, 4); RoPE axes (text position / t, y, x) of 4 + 6 + 6 = head_dim.
TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_layers=2,
    ffn_hidden_size=128,
    in_channels=16,
    out_channels=16,
    patch_size=1,
    text_in_dim=32,
    rope_axes_dim=(4, 6, 6),
)

RELEASED: dict = {}  # the class defaults are ERNIE-Image's config according to the class (no hub here to check)


def inputs(cfg, g, batch, img, txt):
    """Latents, a timestep, the text padded to the longest prompt with its lengths (sample 1 a quarter shorter:
    the model masks the keys past each length)."""
    s = square_side(img, cfg.get("patch_size", 1))
    lengths = torch.tensor([txt - (max(1, txt // 4) if b == 1 else 0) for b in range(batch)])
    return dict(
        hidden_states=torch.randn(batch, cfg.get("in_channels", 128), s, s, generator=g),
        timestep=torch.rand(batch, generator=g) * 1000,
        text_bth=torch.randn(batch, txt, cfg.get("text_in_dim", 2560), generator=g),
        text_lens=lengths,
        return_dict=False,
    )
