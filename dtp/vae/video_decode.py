"""Wan's, Qwen-Image's, CogVideoX's and Magvit's `_decode` on row strips: each rank keeps only its rows of every
decoded frame chunk (CogVideoX: each 2-frame batch, its conv cache this rank's rows; Magvit: the first frame, then
each batch).

diffusers' `AutoencoderKLWan._decode` (and Qwen-Image's copy of it) runs the decoder once per latent frame
and concatenates the frame chunks, `out = torch.cat([out, out_], 2)`, then unpatchifies (Wan 2.2) and clamps.
With the split at the decoder alone, every chunk leaves the decoder gathered, so every rank builds the whole
video (and twice that while the last chunk is appended). Split here instead:

    z (B, C, T, H, W) the same on every rank
      -> rank r keeps latent rows [b_r, b_r+1) (`split_rows(H, N)`), for the whole `_decode`
      -> diffusers' own `_decode` on the strip: post_quant_conv (1 x 1 x 1: row-local), the decoder per frame
         (its entry sees the call in flight and neither splits nor gathers), cat, unpatchify (row-local:
         latent row h -> rows [h p, h p + p)) and clamp on this rank's rows only
      -> one gather of the finished video at the end (`gather_output=True`), or the strip as is

Per-rank peak: the strip's activations and its 1/N of the growing video, plus the gathered video once.
Tiled decodes (`use_tiling` with a latent larger than a tile) run diffusers' `_decode` on the whole latent,
its decoder split per tile as before.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ForwardError
from .halo import gather_rows
from .split import Split
from .strip_rules import FRAME_LOOP_VAES  # noqa: F401  (its home is rules.VAE_CLASSES; dtp/fit imports it from here)
from .strips import bounds, split_rows

ROW_DIM = 3  # (B, C, T, H, W)


def strip_decode(vae: nn.Module, split: Split, gather_output: bool):
    """A replacement for `vae._decode` (bound to `vae`) that decodes this rank's latent rows, gathered once."""
    whole_decode = vae._decode

    def _decode(z: torch.Tensor, return_dict: bool = True):
        from diffusers.models.autoencoders.vae import DecoderOutput

        if _tiled(vae, z):
            return whole_decode(z, return_dict=return_dict)
        with split.call(_units(z.shape[ROW_DIM], split.world)):
            start = bounds(split.units)[split.rank]
            (out,) = whole_decode(z.narrow(ROW_DIM, start, split.units[split.rank]), return_dict=False)
            if gather_output:
                out = gather_rows(out, ROW_DIM, split.counts(out.shape[ROW_DIM]), split.group)
        return DecoderOutput(sample=out) if return_dict else (out,)

    return _decode


def check_post_quant_conv(vae: nn.Module) -> str | None:
    """Why `vae.post_quant_conv` cannot run on a strip as is (None: it is 1 x 1 (x 1) without padding, row-local)."""
    conv = getattr(vae, "post_quant_conv", None)
    if conv is None:
        return None
    padding = tuple(getattr(conv, "_padding", conv.padding))
    ones = (1,) * len(conv.kernel_size)  # 3-D, or 2-D for Qwen-Image 2.1's image conv
    if tuple(conv.kernel_size) != ones or any(padding) or tuple(conv.stride) != ones:
        return f"post_quant_conv with kernel {tuple(conv.kernel_size)}, padding {padding}, stride {conv.stride}"
    return None


def _tiled(vae: nn.Module, z: torch.Tensor) -> bool:
    """diffusers' own test in `_decode`: a tiled decode when tiling is on and the latent exceeds a tile (CogVideoX
    keeps the tile's latent size, the others its pixel size and the compression ratio)."""
    if not vae.use_tiling:
        return False
    height, width = z.shape[ROW_DIM], z.shape[ROW_DIM + 1]
    ratio = getattr(vae, "spatial_compression_ratio", None)
    min_height = getattr(vae, "tile_latent_min_height", None) or vae.tile_sample_min_height // ratio
    min_width = getattr(vae, "tile_latent_min_width", None) or vae.tile_sample_min_width // ratio
    return width > min_width or height > min_height


def _units(height: int, world: int) -> tuple[int, ...]:
    if height < world:
        raise ForwardError(
            f"parallel VAE: latent height {height} is less than {world} ranks (one latent row per rank at least)."
        )
    return split_rows(height, world)
