"""Ideogram4Transformer2DModel family (Ideogram 4): Z-Image-style blocks over one packed [left pad, text, image]
sequence per sample, with per-token role indicators, 3-axis MRoPE and a segment (block-diagonal) mask."""

from __future__ import annotations

import torch

from .shapes import square_side

CLASS_NAME = "Ideogram4Transformer2DModel"
PLAN = "ideogram4"

# 4 heads of 16 (tp 1, 2, 4); MRoPE sections (t, h, w) over the 8 frequencies of a head.
TINY = dict(
    in_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    intermediate_size=128,
    adaln_dim=32,
    llm_features_dim=48,
    rope_theta=10000,
    mrope_section=(4, 2, 2),
)

RELEASED: dict = {}  # the class defaults are Ideogram 4's config according to the class docstring (no hub here)

PAD, IMAGE, TEXT = -1, 2, 3  # the segment id of padding, and the indicators diffusers defines for image and text


def inputs(cfg, g, batch, img, txt):
    """The pipeline's packed layout: per sample [left pad][text][image], sample 1's prompt a quarter shorter (its pad
    tokens form their own segment); text positions (n, n, n), image positions (0, h, w) offset past the text."""
    side = square_side(img)
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
    image_pos = torch.cat([torch.zeros(img, 1, dtype=torch.long), grid], dim=1) + txt
    seq = txt + img
    position_ids = torch.zeros(batch, seq, 3, dtype=torch.long)
    segment_ids = torch.full((batch, seq), PAD, dtype=torch.long)
    indicator = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        pad = max(1, txt // 4) if b == 1 else 0
        position_ids[b, pad:txt] = torch.arange(txt - pad)[:, None].expand(-1, 3)
        position_ids[b, txt:] = image_pos
        indicator[b, pad:txt], indicator[b, txt:] = TEXT, IMAGE
        segment_ids[b, pad:] = 1
    return dict(
        hidden_states=torch.randn(batch, seq, cfg.get("in_channels", 128), generator=g),
        timestep=torch.rand(batch, generator=g),
        encoder_hidden_states=torch.randn(batch, seq, cfg.get("llm_features_dim", 53248), generator=g),
        position_ids=position_ids,
        segment_ids=segment_ids,
        indicator=indicator,
        return_dict=False,
    )
