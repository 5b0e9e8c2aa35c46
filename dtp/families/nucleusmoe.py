"""NucleusMoEImageTransformer2DModel family (Nucleus-Image): single-stream blocks whose image tokens attend to
[image, text] keys (GQA), the text projected per block; after the first dense blocks every MLP is a mixture of
64 SwiGLU experts with expert-choice routing plus a shared expert."""

from __future__ import annotations

import torch

from .shapes import square_side, text_mask

CLASS_NAME = "NucleusMoEImageTransformer2DModel"
PLAN = "nucleusmoe"

# The released transformer config (FenomAI/Nucleus-Image transformer/config.json): 32 blocks, the first three
# dense, 64 experts, 4 kv heads, Qwen3-VL-8B text (4096 wide), capacity 0 for the dense blocks (unused), 4.0 for
# blocks 3-4, 2.0 after; grouped matmuls for the experts.
RELEASED = {
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 32,
    "num_key_value_heads": 4,
    "joint_attention_dim": 4096,
    "dense_moe_strategy": "leave_first_three_blocks_dense",
    "num_experts": 64,
    "capacity_factors": [0.0] * 3 + [4.0] * 2 + [2.0] * 27,
    "use_grouped_mm": True,
}
TINY = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA, as released: at tp=4 two ranks share each kv head
    joint_attention_dim=32,
    axes_dims_rope=(4, 6, 6),
    dense_moe_strategy="leave_first_block_dense",  # block 0 dense, block 1 experts
    num_experts=4,
    moe_intermediate_dim=32,
    # capacity ceil(2 x 16 / 4) = 8 of 16 image tokens per expert: the routing really chooses (a capacity of
    # all the tokens would hide a rank that routed differently)
    capacity_factors=[0.0, 2.0],
)


def inputs(cfg, g, batch, img, txt):
    """Packed latents [B, tokens, C], one image shape per sample, text with a mask (sample 1 padded)."""
    side = square_side(img)
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        img_shapes=[(1, side, side)] * batch,
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        encoder_hidden_states_mask=text_mask(batch, txt),
        timestep=torch.rand(batch, generator=g),
        return_dict=False,
    )
