"""Shard-on-load: each rank reads only its own slice of each tensor of a safetensors checkpoint
(diffusers models and transformers text encoders)."""

from .load import LoadStats, build_skeleton, from_pretrained, load_prepared
from .text import is_transformers_class

__all__ = ["LoadStats", "build_skeleton", "from_pretrained", "is_transformers_class", "load_prepared"]
