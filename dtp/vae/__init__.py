"""Parallel VAE: decode and encode split along the height over every rank, exact against the untiled VAE.

strips (row partition math) -> split (group + partition of a call) -> halo (collectives) -> conv, norm,
attention (layers on strips) -> apply (`parallelize_vae`, class and layer checks, install / undo).
"""

from .apply import SUPPORTED, CheckedVae, check_vae, install_vae, parallelize_vae, remove_vae_parallel

__all__ = ["SUPPORTED", "CheckedVae", "check_vae", "install_vae", "parallelize_vae", "remove_vae_parallel"]
