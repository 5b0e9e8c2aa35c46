"""ChromaTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

from .geometry import Geometry
from .shapes import text_mask

CLASS_NAME = "ChromaTransformer2DModel"
PLAN = "chroma"

TINY = dict(
    patch_size=1,
    in_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    axes_dims_rope=(4, 6, 6),
    approximator_num_channels=16,
    approximator_hidden_dim=32,
    approximator_layers=1,
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(two_call_cfg=True)


def inputs(cfg, g, batch, img, txt):
    mask = torch.cat([text_mask(batch, txt), torch.ones(batch, img, dtype=torch.long)], dim=1).bool()
    return dict(
        hidden_states=torch.randn(batch, img, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        timestep=torch.rand(batch, generator=g),
        img_ids=torch.randint(0, 8, (img, 3), generator=g).float(),
        txt_ids=torch.zeros(txt, 3),
        attention_mask=mask,
        return_dict=False,
    )
