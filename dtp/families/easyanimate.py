"""EasyAnimateTransformer3DModel family (EasyAnimate V5.1): MMDiT blocks over [text | video] (separate text
projections and MLP per block), 3-D RoPE on the video part of q and k."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "EasyAnimateTransformer3DModel"
PLAN = "easyanimate"

# EasyAnimate V5.1 12B: the class defaults (48 heads of 64, 48 MMDiT blocks, Qwen2-VL text 3584 wide) plus the
# sizes the class leaves unset, assumed from the pipeline (no hub here: not checked against the released config):
# the Magvit VAE's 16 latent channels in and out, patch 2.
RELEASED = {"in_channels": 16, "out_channels": 16, "patch_size": 2}
TINY = dict(
    num_attention_heads=4,
    attention_head_dim=16,  # the 3-D RoPE splits a head 4 / 6 / 6 (t, h, w)
    in_channels=4,
    out_channels=4,
    patch_size=2,
    num_layers=2,
    mmdit_layers=2,  # every block MMDiT, as released (the plan refuses shared blocks: see its header)
    time_embed_dim=32,
    text_embed_dim=32,
)
# The pipeline: Magvit VAE 4x in time, 8x in space; 49 frames of 512 x 512 px; CFG on a doubled batch.
GEOMETRY = Geometry(vae_time_scale=4, clip=(49, 512, 512), layout="video")


def inputs(cfg, g, batch, img, txt):
    """Latents [B, C, F, H, W] and the Qwen2-VL prompt (the forward takes no text mask)."""
    f, h, w = video_grid(img)
    p = cfg["patch_size"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h * p, w * p, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        return_dict=False,
    )
