"""JoyImageEditTransformer3DModel family (JoyImage Edit): double-stream (image / text) blocks with fused q/k/v per
stream, Wan-style modulation tables; the edit input is several items (target, then references) along time."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side

CLASS_NAME = "JoyImageEditTransformer3DModel"
PLAN = "joyimage_edit"

RELEASED: dict = {}  # the class defaults (no hub here: not checked against the released config)
TINY = dict(
    in_channels=4,
    hidden_size=64,
    num_attention_heads=4,
    text_dim=32,
    num_layers=2,
    rope_dim_list=[4, 6, 6],  # sums to the head dim, 16
)
ITEMS = 2  # the edit target and one reference image, [B, N, C, T, H, W]
# Image edits through a video layout [B, C, T, H, W]: one frame of 1024 x 1024 px (assumed usual size) through a Wan
# 2.1-style VAE (16 latent channels, 8x in space); full-size inputs: the target and one reference, T = 1 each
# ([B, 2, C, 1, H, W]: `analysis/inputs.py` keeps the items axis; 2 x 4096 image tokens at 1024^2).
GEOMETRY = Geometry(vae_time_scale=4, clip=(1, 1024, 1024), layout="video")


def inputs(cfg, g, batch, img, txt):
    """Two items (target, reference) of `img` tokens each, and the prompt (the forward takes no text mask)."""
    side = square_side(img, 2)
    return dict(
        hidden_states=torch.randn(batch, ITEMS, cfg["in_channels"], 1, side, side, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g).float(),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        return_dict=False,
    )
