"""SkyReelsV2Transformer3DModel family: forward inputs, tiny test config, released-config overrides."""

from __future__ import annotations

from .geometry import Geometry
from .wan import TINY, inputs  # Wan 2.1's block structure and token layout: the same tiny config

CLASS_NAME = "SkyReelsV2Transformer3DModel"
PLAN = "skyreels_v2"

__all__ = ["CLASS_NAME", "PLAN", "TINY", "RELEASED", "GEOMETRY", "inputs"]

RELEASED: dict = {}  # the diffusers class defaults are the released checkpoint's config
GEOMETRY = Geometry(vae_time_scale=4, clip=(97, 544, 960), two_call_cfg=True, layout="video")
