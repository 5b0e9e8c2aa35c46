"""ZImageTransformer2DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

import torch

CLASS_NAME = "ZImageTransformer2DModel"
PLAN = "zimage"

TINY = dict(
    all_patch_size=(2,),
    all_f_patch_size=(1,),
    in_channels=4,
    dim=96,
    n_layers=2,
    n_refiner_layers=1,
    n_heads=4,
    n_kv_heads=4,
    cap_feat_dim=32,
    axes_dims=[8, 8, 8],
    axes_lens=[64, 32, 32],
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


def inputs(cfg, g, batch, img, txt):
    side = int(img**0.5) * 2  # patch size 2: img tokens = (side / 2) ** 2
    return dict(
        x=[torch.randn(cfg["in_channels"], 1, side, side, generator=g) for _ in range(batch)],
        t=torch.rand(batch, generator=g),
        cap_feats=[torch.randn(txt, cfg["cap_feat_dim"], generator=g) for _ in range(batch)],
        return_dict=False,
    )
