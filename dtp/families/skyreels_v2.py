"""SkyReelsV2Transformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

from .wan import inputs  # same token layout as Wan 2.1

CLASS_NAME = "SkyReelsV2Transformer3DModel"
PLAN = "skyreels_v2"

TINY = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=16,
    ffn_dim=96,
    num_layers=2,
    rope_max_seq_len=32,
)

__all__ = ["CLASS_NAME", "PLAN", "TINY", "RELEASED", "inputs"]

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
