"""LatteTransformer3DModel family (Latte): PixArt-alpha's blocks over each frame, each followed by a temporal block
over each token position's frames."""

from __future__ import annotations

import torch

from . import pixart
from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "LatteTransformer3DModel"
PLAN = "latte"

# Latte-1: AdaLN-single, a GELU MLP, T5 captions, 16 frames of 512^2 (the class defaults are a GEGLU / LayerNorm
# variant no released checkpoint uses).
RELEASED = {
    "num_attention_heads": 16,
    "attention_head_dim": 72,
    "in_channels": 4,
    "out_channels": 8,
    "num_layers": 28,
    "cross_attention_dim": 1152,
    "patch_size": 2,
    "activation_fn": "gelu-approximate",
    "norm_type": "ada_norm_single",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "caption_channels": 4096,
}
TINY = {
    **{k: v for k, v in pixart.TINY.items() if k != "use_additional_conditions"},
    **{k: RELEASED[k] for k in ("activation_fn", "norm_type", "norm_elementwise_affine", "norm_eps")},
    "video_length": 2,  # the forward adds a temporal position table of exactly video_length frames (video_grid's 2)
}

GEOMETRY = Geometry(clip=(16, 512, 512), layout="video")  # SD's VAE on every frame (no temporal compression)


def inputs(cfg, g, batch, img, txt):
    """Latents [B, C, F, H, W], T5 captions; no text mask (the pipeline passes none: the forward repeats the text
    per frame but not a mask)."""
    f, h, w = video_grid(img)
    p = cfg["patch_size"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h * p, w * p, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        return_dict=False,
    )
