"""OmniGenTransformer2DModel family (OmniGen v1): a Phi-3 decoder over one sequence per sample, [condition tokens
(text ids with input-image patches written into them), a time token, the output image's patches], under a mask that
is causal over the condition and bidirectional over the image."""

from __future__ import annotations

import torch

from .shapes import square_side

CLASS_NAME = "OmniGenTransformer2DModel"
PLAN = "omnigen"

HEAD_DIM = 16
# 4 heads of 16 (tp 1, 2, 4); Phi-3's su-scaled RoPE needs a factor per frequency (head_dim / 2 of them).
TINY = dict(
    in_channels=4,
    patch_size=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=128,
    num_layers=2,
    pad_token_id=60,  # in the last rank's rows, as OmniGen-v1's 32000 of 32064
    vocab_size=64,
    max_position_embeddings=1024,
    original_max_position_embeddings=512,
    rope_scaling={"short_factor": [1.0] * (HEAD_DIM // 2), "long_factor": [1.5] * (HEAD_DIM // 2)},
    pos_embed_max_size=16,
    time_step_dim=32,
)

# OmniGen-v1 (Shitao/OmniGen-v1-diffusers transformer/config.json): Phi-3-mini's widths, which are the class
# defaults, and its su-scaled RoPE factors (48 per list; their values do not change shapes or memory).
RELEASED = {"rope_scaling": {"short_factor": [1.0] * 48, "long_factor": [1.0] * 48}}

CONDITION_TOKENS = 4  # one 4 x 4 latent input image: 2 x 2 patches written over text positions 1 .. 4


def inputs(cfg, g, batch, img, txt):
    """What OmniGenPipeline passes: text ids with one input image's patches written over 4 of them, the pipeline's
    mask (causal over [condition, time token], every token sees the output image; sample 1's prompt left-padded by a
    quarter, its pad keys masked) and positions counted from the first real token."""
    p = cfg["patch_size"]
    side = square_side(img, p)
    txt = max(txt, CONDITION_TOKENS + 2)
    seq = txt + 1 + img
    mask = torch.tril(torch.ones(seq, seq)).repeat(batch, 1, 1)
    mask[:, :, txt + 1 :] = 1  # every token attends to the output image
    position_ids = torch.arange(seq).repeat(batch, 1)
    sizes = {}
    for b in range(batch):
        pad = max(1, txt // 4) if b == 1 else 0
        mask[b, :, :pad] = 0
        position_ids[b] = (torch.arange(seq) - pad).clamp(min=0)
        sizes[b] = [[pad + 1, pad + 1 + CONDITION_TOKENS]]
    latent = torch.randn(1, cfg["in_channels"], 2 * p, 2 * p, generator=g)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], side, side, generator=g),
        timestep=torch.rand(batch, generator=g),
        input_ids=torch.randint(0, cfg["vocab_size"], (batch, txt), generator=g),
        input_img_latents=[latent] * batch,
        input_image_sizes=sizes,
        attention_mask=mask,
        position_ids=position_ids,
        return_dict=False,
    )
