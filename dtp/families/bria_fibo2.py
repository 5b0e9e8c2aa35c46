"""BriaFibo2Transformer2DModel family (Bria FIBO 2.0): Z-Image's blocks over [gist, image] tokens, the gist tokens a
Perceiver's digest of the text, and gated cross-attention to the text in a few injection blocks."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "BriaFibo2Transformer2DModel"
PLAN = "bria_fibo2"

# 4 heads of 16 (tp 1, 2, 4); block 1 is an injection block. Gist counts 4 .. 8 in steps of 4 over texts of 6 .. 14
# tokens, so the padded prompt (6 of 8 tokens) gets 4 gist tokens and the other 8: the batch pads the gist tokens
# and the model masks them (its varlen path).
TINY = dict(
    in_channels=4,
    patch_size=2,
    dim=64,
    n_layers=2,
    n_refiner_layers=1,
    n_heads=4,
    cap_feat_dim=32,
    injection_layer_ids=(1,),
    perceiver_num_layers=1,
    min_num_gist_tokens=4,
    max_num_gist_tokens=8,
    gist_step=4,
    gist_min_text_len=6,
    gist_max_text_len=14,
    axes_dims=(4, 6, 6),
    axes_lens=(32, 16, 16),
)

RELEASED: dict = {}  # the class defaults are FIBO 2.0's config according to the class (no hub here to check)


def inputs(cfg, g, batch, img, txt):
    """Latents, a timestep in [0, 1], the text encoder's bundles ([batch, 1 + injection blocks, txt, width]: the
    Perceiver's first) and their bool mask (sample 1 padded)."""
    s = square_side(img, cfg.get("patch_size", 2))
    bundles = 1 + len(cfg.get("injection_layer_ids", (6, 14, 22, 30, 38)))
    text = torch.randn(batch, bundles, txt, cfg.get("cap_feat_dim", 7680), generator=g)
    return dict(
        hidden_states=torch.randn(batch, cfg.get("in_channels", 32), s, s, generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=text,
        encoder_attention_mask=text_mask(batch, txt).bool(),
        return_dict=False,
    )
