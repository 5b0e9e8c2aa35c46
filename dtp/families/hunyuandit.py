"""HunyuanDiT2DModel family (Hunyuan-DiT): self- and cross-attention blocks with long skip connections (U-ViT style),
CLIP and T5 text joined into one caption, 2-D RoPE passed in by the pipeline."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "HunyuanDiT2DModel"
PLAN = "hunyuandit"

# 4 heads of 16 (tp 1, 2, 4); 4 blocks so that one takes a long skip (blocks past num_layers // 2 do). No style /
# size conditioning, as v1.2. The caption lengths are fixed by the config (a learned padding table and the T5
# pooler's position table are that long).
TINY = dict(
    num_attention_heads=4,
    attention_head_dim=16,
    hidden_size=64,
    in_channels=4,
    patch_size=2,
    sample_size=8,
    num_layers=4,
    mlp_ratio=2.0,
    cross_attention_dim=32,
    cross_attention_dim_t5=32,
    pooled_projection_dim=16,
    text_len=4,
    text_len_t5=6,
    use_style_cond_and_image_meta_size=False,
)

# HunyuanDiT-v1.2-Diffusers: 40 blocks of 16 heads x 88 (the class default hidden_size 1152 does not match
# 16 x 88 = 1408), FFN 6144 wide, no style / size conditioning (v1.2; v1.0 / v1.1 have it).
RELEASED = {
    "hidden_size": 1408,
    "in_channels": 4,
    "patch_size": 2,
    "sample_size": 128,
    "num_layers": 40,
    "mlp_ratio": 4.3637,
    "use_style_cond_and_image_meta_size": False,
}


def inputs(cfg, g, batch, img, txt):
    """Latents, CLIP and T5 captions at the config's lengths (each padded in sample 1: the model swaps padded
    positions for its learned padding table), the pipeline's 2-D RoPE over the latent grid."""
    # imported here, as model_class does: importing the families must not import diffusers' models
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    s = square_side(img, cfg.get("patch_size", 2))
    side, clip, t5 = s // cfg.get("patch_size", 2), cfg.get("text_len", 77), cfg.get("text_len_t5", 256)
    head_dim = cfg.get("attention_head_dim", 88)
    rope = get_2d_rotary_pos_embed(head_dim, ((0, 0), (side, side)), (side, side), use_real=True)
    kwargs = dict(
        hidden_states=torch.randn(batch, cfg.get("in_channels", 4), s, s, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g).float(),  # the pipeline passes the latents' dtype
        encoder_hidden_states=torch.randn(batch, clip, cfg.get("cross_attention_dim", 1024), generator=g),
        text_embedding_mask=text_mask(batch, clip),
        encoder_hidden_states_t5=torch.randn(batch, t5, cfg.get("cross_attention_dim_t5", 2048), generator=g),
        text_embedding_mask_t5=text_mask(batch, t5),
        image_rotary_emb=rope,
        return_dict=False,
    )
    if cfg.get("use_style_cond_and_image_meta_size", True):
        kwargs["image_meta_size"] = torch.tensor([[1024, 1024, 1024, 1024, 0, 0]] * batch, dtype=torch.float32)
        kwargs["style"] = torch.zeros(batch, dtype=torch.long)
    return kwargs
