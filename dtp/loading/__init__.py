"""Shard-on-load: each rank reads only its own slice of each tensor of a safetensors checkpoint."""

from .load import LoadStats, from_pretrained

__all__ = ["LoadStats", "from_pretrained"]
