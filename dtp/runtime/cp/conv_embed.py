"""A Conv3d patch embedding (kernel = stride) computed on chosen tokens only: `grid_embed.py`'s channels-first kind.

Wan's `patch_embedding` (and Wan 2.2 Animate's `pose_patch_embedding`) is `nn.Conv3d(C, D, kernel_size=p,
stride=p)` over latents [B, C, F pt, H ph, W pw]: each output token is the conv of its own patch [C, pt, ph, pw]
and nothing else (no overlap, no padding), so token t of the raster grid [F, H, W] is the same conv run on patch t
alone, a batch of one-patch volumes. `resolve.binding.cp._embeds` checks the conv is of that kind.

Example: latents [1, 36, 3, 4, 4], kernel (1, 2, 2): grid (3, 2, 2), 12 tokens; tokens [5, 6] are the conv of the
two [36, 1, 2, 2] patches at (f, h, w) = (1, 0, 1) and (1, 1, 0), shaped [1, 2, D].
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import ForwardError


def conv_grid(conv: nn.Conv3d, x: torch.Tensor) -> tuple[int, int, int]:
    """The token grid (F, H, W) the conv makes of latents `x` [B, C, F pt, H ph, W pw]; a size it does not divide
    is a ForwardError (the conv would drop the remainder, the per-token patches could not)."""
    sizes, kernel = tuple(x.shape[2:]), tuple(conv.kernel_size)
    if len(sizes) != 3 or any(n % k for n, k in zip(sizes, kernel)):
        raise ForwardError(f"cp embed: latents {tuple(x.shape)} are not whole {kernel} patches of [B, C, F, H, W].")
    return tuple(n // k for n, k in zip(sizes, kernel))


def conv_rows(conv: nn.Conv3d, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The embedded tokens at raster positions `index` [n] of latents `x`: [B, n, D], each the class's own conv
    (`nn.Conv3d.forward`, not the instance's replaced forward) of its patch."""
    batch, channels = x.shape[:2]
    (f, h, w), (pt, ph, pw) = conv_grid(conv, x), conv.kernel_size
    patches = x.view(batch, channels, f, pt, h, ph, w, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
    picked = patches.reshape(batch, f * h * w, channels, pt, ph, pw).index_select(1, index).flatten(0, 1)
    return nn.Conv3d.forward(conv, picked).view(batch, index.numel(), -1)


def conv_index_grid(x: torch.Tensor, grid: tuple[int, int, int], scale: int = 1, offset: int = 0) -> torch.Tensor:
    """offset + scale x the raster index of each token, shaped like the conv's output but for the channels:
    [B, 1, F, H, W] int64, written out per sample (the forward may assign into a slice of it: Wan Animate's
    `hidden_states[:, :, 1:] = ...`, which an expanded view refuses)."""
    count = grid[0] * grid[1] * grid[2]
    codes = torch.arange(count, device=x.device) * scale + offset
    return codes.view(1, 1, *grid).repeat(x.shape[0], 1, 1, 1, 1)
