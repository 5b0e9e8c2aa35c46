"""CogView3PlusTransformer2DModel family (CogView3-Plus): CogView4's inputs and widths, CogVideoX-style blocks."""

from __future__ import annotations

from . import cogview4

CLASS_NAME = "CogView3PlusTransformer2DModel"
PLAN = "cogview3plus"

# CogView4's tiny widths and micro-conditioning; CogView3-Plus has a learned position table, no RoPE.
TINY = {k: v for k, v in cogview4.TINY.items() if k != "rope_axes_dim"}

RELEASED: dict = {}  # the diffusers class defaults are CogView3-Plus-3B's config

inputs = cogview4.inputs  # the same forward signature: latents, text, timestep, original / target size, crop
