"""LongCatImageTransformer2DModel family (LongCat-Image: FLUX.1 layout, no pooled projection — Bria 3.2's inputs)."""

from __future__ import annotations

from . import bria

CLASS_NAME = "LongCatImageTransformer2DModel"
PLAN = "longcat_image"

TINY = dict(bria.TINY)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config

inputs = bria.inputs
