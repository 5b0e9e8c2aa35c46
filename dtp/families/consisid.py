"""ConsisIDTransformer3DModel family (ConsisID): CogVideoX's blocks plus a local facial extractor (a perceiver over
face-recognition and ViT features) whose tokens the video attends to after every `cross_attn_interval` blocks."""

from __future__ import annotations

import torch

from . import cogvideox

CLASS_NAME = "ConsisIDTransformer3DModel"
PLAN = "consisid"

# CogVideoX's tiny config with 24-wide heads (inner 96: the perceiver's kv width is 2/3 of it, 64 = LFE output) and a
# small face branch: 2 perceiver layers over 2 ViT scales, 4 queries + 2 id tokens, cross-attention every block.
TINY = {
    **cogvideox.TINY,
    "attention_head_dim": 24,
    "is_train_face": True,
    "cross_attn_interval": 1,
    "cross_attn_dim_head": 16,
    "cross_attn_num_heads": 4,
    "LFE_id_dim": 16,
    "LFE_vit_dim": 16,
    "LFE_depth": 2,
    "LFE_dim_head": 8,
    "LFE_num_heads": 2,
    "LFE_num_id_token": 2,
    "LFE_num_querie": 4,
    "LFE_output_dim": 64,
    "LFE_ff_mult": 2,
    "LFE_num_scale": 2,
}

# CogVideoX-5B-I2V's widths (48 heads of 64, 42 layers; 32 input channels: the image latents concatenated) with the
# face branch on, as diffusers' ConsisID pipeline uses it; not checked against the released weights (no hub here).
RELEASED = {
    "num_attention_heads": 48,
    "num_layers": 42,
    "in_channels": 32,
    "use_rotary_positional_embeddings": True,
    "is_train_face": True,
}

GEOMETRY = cogvideox.GEOMETRY  # CogVideoX's VAE (4x in time, 8x in space), 49 x 480 x 720, [B, F, C, H, W]


def inputs(cfg, g, batch, img, txt):
    """CogVideoX's inputs plus the face embedding (id_cond) and one ViT feature map per scale (id_vit_hidden)."""
    kwargs = cogvideox.inputs(cfg, g, batch, img, txt)
    kwargs["id_cond"] = torch.randn(batch, cfg["LFE_id_dim"], generator=g)
    kwargs["id_vit_hidden"] = [
        torch.randn(batch, 5, cfg["LFE_vit_dim"], generator=g) for _ in range(cfg["LFE_num_scale"])
    ]
    return kwargs
