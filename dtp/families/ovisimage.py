"""OvisImageTransformer2DModel family (Ovis-Image): forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

from . import bria

CLASS_NAME = "OvisImageTransformer2DModel"
PLAN = "ovisimage"

TINY = dict(
    patch_size=1,
    in_channels=16,
    out_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    axes_dims_rope=(4, 6, 6),
)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config


inputs = bria.inputs  # FLUX.1's layout without a pooled projection, as Bria 3.2 and LongCat-Image
