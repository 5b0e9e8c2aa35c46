"""Kandinsky6SRTransformer3DModel family (Kandinsky 6 video super-resolution): text-free blocks of NABLA sparse
self-attention (a flex BlockMask chosen per head from 8 x 8-token block statistics, or'ed with a sliding-tile prior)
and a GELU MLP over channels-last latent tiles; Kandinsky 6's attention, modulation and MLP modules."""

from __future__ import annotations

import torch

from .geometry import Geometry

CLASS_NAME = "Kandinsky6SRTransformer3DModel"
PLAN = "kandinsky6_sr"

RELEASED: dict = {}  # the class defaults (the docstring: out_visual_dim 640 is the distilled checkpoints' n_grid x 64)
# Kandinsky 6's tiny widths (4 heads of 16); the sliding-tile prior (nabla_window) reaching no other 8 x 8 block and
# a lower threshold, so NABLA chooses per head: each query block attends to 2 or 3 of the 4 (measured). tp 1, 2, 4.
TINY = dict(
    in_visual_dim=4,
    out_visual_dim=8,
    time_dim=32,
    model_dim=64,
    ff_dim=128,
    num_visual_blocks=2,
    axes_dims=(4, 6, 6),
    nabla_window=(1, 1, 1),
    nabla_threshold=0.5,
)
# The SR pipeline refines 512 x 512 px tiles of a 5 s clip through the K-VAE (16x in space, 4x in time, patch 1):
# 31 latent frames of 32 x 32 tokens; one call per step (no text, no CFG).
GEOMETRY = Geometry(vae_scale=16, patch=1, vae_time_scale=4, clip=(121, 512, 512), layout="video_packed")
TILE_SIDE = 32  # tokens per side of the 512 x 512 px tile


def sr_grid(img: int) -> tuple[int, int, int]:
    """(frames, height, width) in tokens: whole 32 x 32 tiles when `img` counts them (full size), else the tiny
    grid 2 x 8 x 16, two 8 x 8 NABLA blocks a frame (NABLA needs sides divisible by 8, so `img` is not kept)."""
    if img % TILE_SIDE**2 == 0:
        return img // TILE_SIDE**2, TILE_SIDE, TILE_SIDE
    return 2, 8, 16


def inputs(cfg, g, batch, img, txt):
    """Channels-last latent tiles [noisy latent | anchor latent | anchor mask] and the timestep (no text)."""
    f, h, w = sr_grid(img)
    pt, ph, pw = cfg.get("patch_size", (1, 1, 1))
    channels = 2 * cfg.get("in_visual_dim", 64) + 1
    return dict(
        hidden_states=torch.randn(batch, f * pt, h * ph, w * pw, channels, generator=g),
        timestep=torch.rand(batch, generator=g) * 1000,
        return_dict=False,
    )
