"""SanaVideoTransformer3DModel family (Sana-Video): Sana's blocks over a latent video, with Wan's 3-D RoPE, QK-norms
across heads in both attentions and a temporal convolution in the Mix-FFN."""

from __future__ import annotations

from . import sana, wan
from .geometry import Geometry
from .shapes import text_mask

CLASS_NAME = "SanaVideoTransformer3DModel"
PLAN = "sana_video"

TINY = {**sana.TINY, "patch_size": (1, 2, 2)}  # Sana's tiny widths; a video patch

RELEASED: dict = {}  # the diffusers class defaults are Sana-Video 2B's config
# Wan 2.1's VAE (8x, 4x in time), the pipeline's 480 x 832 x 81 default; CFG on a doubled batch (one call).
GEOMETRY = Geometry(vae_time_scale=4, clip=(81, 480, 832), layout="video")


def inputs(cfg, g, batch, img, txt):
    """Wan's video and text inputs with the caption width of Sana and a padded prompt (text mask)."""
    kwargs = wan.inputs({**cfg, "text_dim": cfg["caption_channels"]}, g, batch, img, txt)
    return {**kwargs, "encoder_attention_mask": text_mask(batch, txt)}
