"""CogVideoXTransformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import square_side

CLASS_NAME = "CogVideoXTransformer3DModel"
PLAN = "cogvideox"

TINY = dict(
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    time_embed_dim=16,
    text_embed_dim=32,
    num_layers=2,
    sample_width=8,
    sample_height=8,
    sample_frames=5,
    patch_size=2,
    max_text_seq_length=8,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_time_scale=4, clip=(49, 480, 720), layout="video_fchw")


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    frames = (cfg["sample_frames"] - 1) // cfg.get("temporal_compression_ratio", 4) + 1
    return dict(
        hidden_states=torch.randn(batch, frames, cfg["in_channels"], s, s, generator=g),
        encoder_hidden_states=torch.randn(batch, cfg["max_text_seq_length"], cfg["text_embed_dim"], generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        return_dict=False,
    )
