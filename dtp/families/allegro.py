"""AllegroTransformer3DModel family (Allegro): PixArt-style blocks (self-attention with a 3-D RoPE, cross-attention to
T5 captions, GELU MLP, AdaLN-single) over all video tokens at once."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask, video_grid

CLASS_NAME = "AllegroTransformer3DModel"
PLAN = "allegro"

RELEASED: dict = {}  # the class defaults are Allegro's released config (its docstring)
TINY = dict(
    num_attention_heads=4,
    attention_head_dim=24,  # the RoPE rotates thirds of a head (t, h, w), each of even width
    in_channels=4,
    out_channels=4,
    num_layers=2,
    cross_attention_dim=96,
    caption_channels=32,
    sample_height=8,
    sample_width=8,
    sample_frames=2,
)
# Allegro's pipeline: a 4x-in-time, 8x-in-space VAE, 88 frames of 720 x 1280 px (85 here: 1 + 4k); CFG on a
# doubled batch. Layout "video_packed": the RoPE positions must follow the token count, so full-size inputs come from
# the builder (2 frames of 2 x n / 4 tokens: the count of the clip, another grid shape).
GEOMETRY = Geometry(vae_time_scale=4, clip=(85, 720, 1280), layout="video_packed")


def inputs(cfg, g, batch, img, txt):
    """Latents [B, C, F, H, W], T5 captions with a mask (sample 1 padded), and the 3-D RoPE the pipeline passes
    (its `_prepare_rotary_positional_embeddings`: frequency tables and each token's (t, h, w) position)."""
    f, h, w = video_grid(img)
    p = cfg.get("patch_size", 2)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h * p, w * p, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["caption_channels"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        image_rotary_emb=_rope(cfg, f, h, w),
        return_dict=False,
    )


def _rope(cfg, frames: int, height: int, width: int):
    """Allegro's pipeline's RoPE for a grid of frames x height x width tokens."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro  # here: `import dtp` loads no diffusers

    scales = tuple(cfg.get(f"interpolation_scale_{a}", d) for a, d in (("t", 2.2), ("h", 2.0), ("w", 2.0)))
    freqs_t, freqs_h, freqs_w, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=cfg["attention_head_dim"],
        crops_coords=((0, 0), (height, width)),
        grid_size=(height, width),
        temporal_size=frames,
        interpolation_scale=scales,
    )
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long())
    pos = pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()
    return (freqs_t, freqs_h, freqs_w), tuple(pos)
