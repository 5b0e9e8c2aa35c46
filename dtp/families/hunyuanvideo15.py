"""HunyuanVideo15Transformer3DModel family (HunyuanVideo 1.5): forward inputs, tiny config, released overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask, video_grid

CLASS_NAME = "HunyuanVideo15Transformer3DModel"
PLAN = "hunyuanvideo15"

# Both text streams (the MLLM text through the token refiner, the ByT5 glyph text through its mapper) and the
# SigLIP image tokens; 4 heads of 16 (tp 1, 2, 4). in_channels = 2 x latent + 1 mask channel, as released.
TINY = dict(
    in_channels=9,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=2,
    num_refiner_layers=1,
    text_embed_dim=32,
    text_embed_2_dim=24,
    image_embed_dim=16,
    rope_axes_dim=(4, 6, 6),
)

RELEASED: dict = {}  # the diffusers class defaults are the released 480p image-to-video checkpoint's config

# 16x VAE in space, 4x in time, patch 1; the 480p checkpoint's usual clip, true CFG as two calls (as HunyuanVideo)
GEOMETRY = Geometry(vae_scale=16, patch=1, vae_time_scale=4, clip=(121, 480, 848), two_call_cfg=True, layout="video")

IMAGE_TOKENS = 4  # SigLIP tokens of the reference image in the tiny inputs


def inputs(cfg, g, batch, img, txt):
    """Video latents, the MLLM and ByT5 prompts (sample 1 right-padded), and reference-image tokens."""
    f, h, w = video_grid(img)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f, h, w, generator=g),
        timestep=torch.rand(batch, generator=g) * 1000,  # a float: its embedder has no cast
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=text_mask(batch, txt),
        encoder_hidden_states_2=torch.randn(batch, txt // 2, cfg["text_embed_2_dim"], generator=g),
        encoder_attention_mask_2=text_mask(batch, txt // 2),
        image_embeds=torch.randn(batch, IMAGE_TOKENS, cfg["image_embed_dim"], generator=g),
        return_dict=False,
    )
