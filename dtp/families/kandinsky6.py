"""Kandinsky6Transformer3DModel family (Kandinsky 6 text/image to video + audio): a video and an audio text branch
(encoder blocks over the Qwen prompt), then fused decoder blocks in which the video and audio streams each run
self-attention, cross-attention to their text and an MLP, and attend to each other (va / av cross-attention).
Channels-last latents [B, F, H, W, C] as in Kandinsky 5 (`kandinsky5.py`), whose geometry this family shares."""

from __future__ import annotations

import math

import torch

from . import kandinsky5
from .shapes import text_mask, video_grid

CLASS_NAME = "Kandinsky6Transformer3DModel"
PLAN = "kandinsky6"

# The class docstring: released checkpoints set these four flags (each checkpoint's transformer/config.json); the
# widths are the class defaults, assumed to be Kandinsky-6.0-Pro's (no hub here: not checked). Two token types: the
# pipeline marks an appended reference frame with type 1 (image to video), so the table holds at least two rows.
RELEASED = dict(
    text_token_padding=True,
    ca_rope=True,
    cross_gates=True,
    fix_modulation=True,
    visual_token_type_num_embeddings=2,
)
# Kandinsky 5's tiny widths (video 4 heads of 16); the audio stream at the same width (ca_rope rotates audio keys
# with the video head size, so the audio head size must match) with its own MLP width; the released flags on.
# tp 1, 2, 4.
TINY = dict(
    kandinsky5.TINY,
    num_text_blocks=1,
    num_visual_blocks=2,
    in_audio_dim=8,
    out_audio_dim=8,
    ff_dim_a=96,
    **RELEASED,
)
# Kandinsky 6's pipeline: HunyuanVideo's VAE (4x in time, 8x in space), 121 frames at 480 x 832 (its docstring
# example); CFG as two calls; channels-last latents built by the family from the token count (`video_packed`).
GEOMETRY = kandinsky5.GEOMETRY


def audio_frames(latent_frames: int, fps: float = 24.0, sample_rate: int = 44_100, hop: int = 1024) -> int:
    """Audio latent frames of `latent_frames` video latent frames, as the pipeline sizes them (its audio VAE: 44.1
    kHz, a latent every 1024 samples; 4x in time): 2 latent frames (5 video frames) -> 9; 31 (121) -> 218. Neither
    divides by 2 or 8: the plan pads the audio stream under cp."""
    return math.ceil(((latent_frames - 1) * 4 + 1) / fps * sample_rate / hop)


def inputs(cfg, g, batch, img, txt):
    """Channels-last video latents with the conditioning channels ([latent | condition latent | mask]), audio
    latents, the Qwen prompt (sample 1 right-padded: a bool mask) and its pooled CLIP embedding, per-frame token
    types (the last frame a reference, type 1, when the config has the table)."""
    f, h, w = video_grid(img)
    patch = cfg.get("patch_size", (1, 2, 2))
    channels = 2 * cfg["in_visual_dim"] + 1 if cfg.get("visual_cond", True) else cfg["in_visual_dim"]
    kwargs = dict(
        hidden_states=torch.randn(batch, f * patch[0], h * patch[1], w * patch[2], channels, generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg.get("in_text_dim", 3584), generator=g),
        pooled_projections=torch.randn(batch, cfg.get("in_text_dim2", 768), generator=g),
        timestep=torch.rand(batch, generator=g) * 1000,
        audio_hidden_states=torch.randn(batch, audio_frames(f * patch[0]), cfg.get("in_audio_dim", 20), generator=g),
        encoder_attention_mask=text_mask(batch, txt).bool(),
        return_dict=False,
    )
    if cfg.get("visual_token_type_num_embeddings", 0) > 1:
        types = torch.zeros(batch, f, dtype=torch.long)
        types[:, -1] = 1
        kwargs["visual_token_type_ids"] = types
    return kwargs
