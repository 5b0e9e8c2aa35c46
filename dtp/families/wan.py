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


def inputs(cfg, g, batch, img, txt):
    pt, ph, pw = cfg["patch_size"]
    f, h, w = video_grid(img)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], f * pt, h * ph, w * pw, generator=g),
        timestep=torch.randint(0, 1000, (batch,), generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["text_dim"], generator=g),
        return_dict=False,
    )
