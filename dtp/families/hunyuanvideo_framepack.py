"""HunyuanVideoFramepackTransformer3DModel family (FramePack): HunyuanVideo's blocks over the next frames with clean,
2x and 4x history latents prepended as tokens and a CLIP image embedding prepended to the text."""

from __future__ import annotations

import torch

from . import hunyuanvideo

CLASS_NAME = "HunyuanVideoFramepackTransformer3DModel"
PLAN = "hunyuanvideo_framepack"

# The forward always runs the history embedder and the image projection: the released FramePack has both.
RELEASED = {"has_image_proj": True, "has_clean_x_embedder": True}
TINY = {**hunyuanvideo.TINY, **RELEASED, "image_proj_dim": 16}

GEOMETRY = hunyuanvideo.GEOMETRY  # HunyuanVideo's VAE (4x in time, 8x in space)

HISTORY = {"clean": 1, "history_2x": 2, "history_4x": 4}  # latent frames of each history, as the pipeline packs them


def inputs(cfg, g, batch, img, txt):
    """HunyuanVideo's inputs plus the histories (same latent height and width as the noisy frames), the 1-D frame
    indices of each (histories first), and CLIP image tokens."""
    kwargs = hunyuanvideo.inputs(cfg, g, batch, img, txt)
    _, channels, frames, height, width = kwargs["hidden_states"].shape
    start = 0
    for name, count in HISTORY.items():
        kwargs[f"latents_{name}"] = torch.randn(batch, channels, count, height, width, generator=g)
        kwargs[f"indices_latents_{name}"] = torch.arange(start, start + count)
        start += count
    kwargs["indices_latents"] = torch.arange(start, start + frames)
    kwargs["image_embeds"] = torch.randn(batch, 4, cfg["image_proj_dim"], generator=g)
    return kwargs


def regrid(kwargs, grid):
    """Full-size inputs (`analysis/inputs.py`): the histories on the latent grid of `hidden_states` (already the
    full-size one) and the frame indices of the f noisy frames after them (as `inputs` numbers them)."""
    f, h, w = grid
    latent = kwargs["hidden_states"]
    batch, channels = latent.shape[:2]
    start = 0
    for name, count in HISTORY.items():
        shape = (batch, channels, count, h, w)
        kwargs[f"latents_{name}"] = torch.empty(shape, dtype=latent.dtype, device=latent.device)
        kwargs[f"indices_latents_{name}"] = torch.arange(start, start + count)
        start += count
    kwargs["indices_latents"] = torch.arange(start, start + f)
    return kwargs
