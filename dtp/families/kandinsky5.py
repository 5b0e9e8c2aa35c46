"""Kandinsky5Transformer3DModel family (Kandinsky 5 video): text encoder blocks, then visual decoder blocks
(self-attention with a 3-D RoPE, cross-attention to the text, GELU MLP); channels-last latents [B, F, H, W, C]."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "Kandinsky5Transformer3DModel"
PLAN = "kandinsky5"

RELEASED: dict = {}  # the class defaults (no hub here: not checked against the released config)
TINY = dict(
    in_visual_dim=4,
    in_text_dim=32,
    in_text_dim2=16,
    time_dim=32,
    out_visual_dim=4,
    model_dim=64,
    ff_dim=128,
    num_text_blocks=1,
    num_visual_blocks=2,
    axes_dims=(4, 6, 6),  # head_dim 16: 4 heads
)
# Kandinsky 5's pipeline: a HunyuanVideo-style VAE (4x in time, 8x in space), 121 frames of 512 x 768 px assumed;
# CFG as two calls. Layout "video_packed": the latents are channels-last [B, F, H, W, C] and the RoPE positions follow
# the grid, so full-size inputs come from the builder (2 frames of 2 x n / 4 tokens: the clip's count).
GEOMETRY = Geometry(vae_time_scale=4, clip=(121, 512, 768), two_call_cfg=True, layout="video_packed")


def inputs(cfg, g, batch, img, txt):
    """Channels-last latents [B, F, H, W, C], the Qwen text and pooled CLIP embeddings, and the RoPE positions the
    pipeline passes (every frame, row and column index; the text positions 0..txt-1)."""
    f, h, w = video_grid(img)
    patch = cfg.get("patch_size", (1, 2, 2))
    return dict(
        hidden_states=torch.randn(batch, f * patch[0], h * patch[1], w * patch[2], cfg["in_visual_dim"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["in_text_dim"], generator=g),
        timestep=torch.rand(batch, generator=g) * 1000,
        pooled_projections=torch.randn(batch, cfg["in_text_dim2"], generator=g),
        visual_rope_pos=[torch.arange(f), torch.arange(h), torch.arange(w)],
        text_rope_pos=torch.arange(txt),
        return_dict=False,
    )
