"""Parallel VAE: decode and encode split along the height over every rank, exact against the untiled VAE.

strips (row partition math) -> split (group + partition of a call) -> halo (collectives) -> conv, norm,
attention (layers on strips) -> strip_rule (`StripRule`) -> one module of rules per VAE family (image, wan_qwen,
hunyuan, ltx, ..., mochi, cosmos) -> strip_rules (the class and layer tables) -> video_decode (the frame loop split
at `_decode`) -> apply (`parallelize_vae`: check against the tables, install, undo).
"""

from .apply import SUPPORTED, VIDEO_VAES, CheckedVae, check_vae, install_vae, parallelize_vae, remove_vae_parallel
from .strip_rules import FRAME_LOOP_VAES

__all__ = [
    "FRAME_LOOP_VAES",
    "SUPPORTED",
    "VIDEO_VAES",
    "CheckedVae",
    "check_vae",
    "install_vae",
    "parallelize_vae",
    "remove_vae_parallel",
]
