"""HeliosTransformer3DModel family (Helios): Wan 2.1's blocks over the noisy latents plus short / mid / long history
latents (patched at 1x, 2x, 4x), prepended as tokens with timestep 0; cross-attention on the current tokens only."""

from __future__ import annotations

import torch

from . import wan
from .shapes import video_grid

CLASS_NAME = "HeliosTransformer3DModel"
PLAN = "helios"

TINY = {
    **{k: v for k, v in wan.TINY.items() if k != "rope_max_seq_len"},
    "rope_dim": (4, 6, 6),  # frames, rows, columns: sums to the head dim, 16
}

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = wan.GEOMETRY  # Wan 2.1's VAE (4x in time, 8x in space) and clip
HISTORY = {"long": 4, "mid": 2, "short": 1}  # latent frames of each history


def inputs(cfg, g, batch, img, txt):
    """Wan's inputs with the three history latents and every frame index the pipeline passes: the history frames
    come first (long, mid, short), then the noisy ones; each history's spatial size is the noisy latents'."""
    kwargs = wan.inputs(cfg, g, batch, img, txt)
    f = video_grid(img)[0]
    _, channels, _, height, width = kwargs["hidden_states"].shape
    start = 0
    for name, frames in HISTORY.items():
        kwargs[f"latents_history_{name}"] = torch.randn(batch, channels, frames, height, width, generator=g)
        kwargs[f"indices_latents_history_{name}"] = torch.arange(start, start + frames).expand(batch, -1)
        start += frames
    kwargs["indices_hidden_states"] = torch.arange(start, start + f).expand(batch, -1)
    return kwargs


def regrid(kwargs, grid):
    """Full-size inputs (`analysis/inputs.py`): the histories on the latent grid of `hidden_states` (already the
    full-size one, f x h x w latent frames and pixels) and the frame indices of f noisy frames after them."""
    f, h, w = grid
    latent = kwargs["hidden_states"]
    batch, channels = latent.shape[:2]
    start = 0
    for name, frames in HISTORY.items():
        shape = (batch, channels, frames, h, w)
        kwargs[f"latents_history_{name}"] = torch.empty(shape, dtype=latent.dtype, device=latent.device)
        kwargs[f"indices_latents_history_{name}"] = torch.arange(start, start + frames).expand(batch, -1)
        start += frames
    kwargs["indices_hidden_states"] = torch.arange(start, start + f).expand(batch, -1)
    return kwargs
