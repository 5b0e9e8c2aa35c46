"""WanTransformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import video_grid

CLASS_NAME = "WanTransformer3DModel"
PLAN = "wan"

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

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_time_scale=4, clip=(81, 480, 832), two_call_cfg=True, layout="video")


# With the I2V image branch (added_kv_proj_dim), WanAttnProcessor takes the last 512 tokens of attn2's keys as the
# text and the rest as the CLIP image tokens (hard-coded): the prompt is then always umT5's padded 512 tokens.
I2V_TEXT_TOKENS = 512


def inputs(cfg, g, batch, img, txt):
    """Video latents and a prompt; with `image_dim` (Wan 2.1 I2V) also CLIP image tokens, which the condition
    embedder projects and prepends to the prompt."""
    pt, ph, pw = cfg["patch_size"]
    f, h, w = video_grid(img)
    txt = I2V_TEXT_TOKENS if cfg.get("added_kv_proj_dim") else txt
    kwargs = dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f * pt, h * ph, w * pw, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        return_dict=False,
    )
    if cfg.get("image_dim"):
        kwargs["encoder_hidden_states_image"] = torch.randn(batch, 4, cfg["image_dim"], generator=g)
    return kwargs
