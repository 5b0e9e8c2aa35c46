"""PixArtTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "PixArtTransformer2DModel"
PLAN = "pixart"

# Issue 10 coverage: 4 heads of 16 (tp 1, 2, 4), two blocks of each kind, so that heterogeneous
# blocks (SD3's and Mochi's context-only last block, SD3.5-M's dual attention) are present.
# Lumina2: 8 q / 4 kv heads of 8 (GQA; tp 1, 2, 4: at tp 8 every width divides, the kv heads
# do not). Mochi: heads of 24 so that both SwiGLU halves (256 and 64 wide) divide by 4.
# Cosmos: no padding-mask channel (its resize needs torchvision). HiDream: 4 routed experts,
# top-2, as HiDream-I1.
TINY = dict(
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    cross_attention_dim=64,
    sample_size=8,
    patch_size=2,
    caption_channels=32,
    use_additional_conditions=False,
)

# PixArt-Sigma XL 1024: T5-XXL captions (the class default leaves caption_channels unset), no
# resolution / aspect-ratio conditioning.
RELEASED = {"caption_channels": 4096, "use_additional_conditions": False}


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        added_cond_kwargs={"resolution": None, "aspect_ratio": None},
        encoder_attention_mask=text_mask(batch, txt),
        return_dict=False,
    )
