"""`dtp fit`: per-rank peak memory and step time of every way to run a pipeline on N GPUs (see estimate.py)."""

from .estimate import fit

__all__ = ["fit"]
