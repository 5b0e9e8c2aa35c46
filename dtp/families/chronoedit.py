"""ChronoEditTransformer3DModel family (ChronoEdit: Wan 2.1 with temporal-skip RoPE)."""

from __future__ import annotations

from . import wan

CLASS_NAME = "ChronoEditTransformer3DModel"
PLAN = "chronoedit"

TINY = dict(wan.TINY)

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config

GEOMETRY = wan.GEOMETRY  # Wan 2.1's VAE and clip; the edit runs as a short video

inputs = wan.inputs
