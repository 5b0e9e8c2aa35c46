"""HiDreamImageTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .shapes import square_side

CLASS_NAME = "HiDreamImageTransformer2DModel"
PLAN = "hidream"

TINY = dict(
    patch_size=2,
    in_channels=4,
    out_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=4,
    caption_channels=[32, 16],
    text_emb_dim=16,
    num_routed_experts=4,
    num_activated_experts=2,
    axes_dims_rope=(8, 4, 4),
    max_resolution=(16, 16),
    llama_layers=[0, 1],
)

# HiDream-I1: the class defaults leave the patch size and text widths unset (it cannot be built
# without them) and pair two RoPE axes with three position columns: patch 2; T5-XXL and
# Llama-3.1-8B states are both 4096 wide. llama_layers only picks which stacked Llama state
# each of the 48 blocks reads; any 48 indices below 32 give the same shapes.
RELEASED = {
    "patch_size": 2,
    "caption_channels": [4096, 4096],
    "llama_layers": [i % 32 for i in range(48)],
    "axes_dims_rope": [64, 32, 32],  # 3 position axes (the default pair does not match its 3-column ids)
}


def inputs(cfg, g, batch, img, txt):
    s = square_side(img, cfg["patch_size"])
    t5, llama = cfg["caption_channels"]
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], s, s, generator=g),
        timesteps=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states_t5=torch.randn(batch, txt, t5, generator=g),
        encoder_hidden_states_llama3=torch.randn(len(cfg["llama_layers"]), batch, txt, llama, generator=g),
        pooled_embeds=torch.randn(batch, cfg["text_emb_dim"], generator=g),
        return_dict=False,
    )
