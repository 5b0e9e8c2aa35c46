"""AutoencoderKLHunyuanVideo15 (HunyuanVideo 1.5) and AutoencoderKLHunyuanImageRefiner (HunyuanImage 2.1's refiner, the
same layout under `HunyuanImageRefiner*` names) on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_hunyuanvideo15.py`) and why each is exact on strips:
- HunyuanVideo15CausalConv3d: HunyuanVideo's causal conv (F.pad replicate over W, H and causally over T, then an
  nn.Conv3d with padding 0): `hunyuan.causal_conv3d_rows` (halo rows; the image's edge row repeated at its top and
  bottom only).
- HunyuanVideo15RMS_norm: F.normalize over the channels of each position: row-local.
- HunyuanVideo15Downsample / HunyuanVideo15Upsample: a stride-1 causal conv (its own rule) and space-to-depth /
  depth-to-space by 2 in H (the first frame alone in time): strip bounds are multiples of 2 at every grid
  (`strips.py`), so each strip maps to whole rows: row-local; the downsample halves the height.
- HunyuanVideo15AttnBlock (the mid block's): single-head attention over all T x H x W positions, causal over frames,
  with an RMS norm and 1 x 1 x 1 conv projections. On strips: local queries, K and V of every rank gathered, the
  causal mask rebuilt for (local query frames) x (gathered key frames) -- `attn_block_rows`. The refiner's
  HunyuanImageRefinerAttnBlock is the same without the mask.
- The refiner's UpsampleDCAE / DownsampleDCAE: the same depth-to-space / space-to-depth by 2 in H (the first frame
  handled differently in time only): row-local.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .halo import gather_rows
from .hunyuan import causal_conv3d_rows, causal_frame_mask, check
from .split import Split
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check

CAUSAL_ATTENTION = "HunyuanVideo15AttnBlock"  # the refiner's attention block has no mask


def attn_block_rows(block: nn.Module, x: torch.Tensor, split: Split) -> torch.Tensor:
    """HunyuanVideo15AttnBlock.forward (or the refiner's, without the mask) on a (B, C, T, h, W) strip: this rank's
    queries against every key.

    Tokens are (t, row, column) in row-major order on each rank; K and V are gathered in rank order, and the mask
    (0 where key frame <= query frame, -inf elsewhere) is built for that order (`hunyuan.causal_frame_mask`).
    """
    identity = x
    x = block.norm(x)
    query, key, value = block.to_q(x), block.to_k(x), block.to_v(x)
    batch, channels, frames, height, width = query.shape
    query, key, value = (t.reshape(batch, channels, -1).transpose(1, 2).unsqueeze(1) for t in (query, key, value))
    rows = split.counts(height)
    counts = tuple(frames * r * width for r in rows)
    key = gather_rows(key.contiguous(), 2, counts, split.group)
    value = gather_rows(value.contiguous(), 2, counts, split.group)
    mask = None
    if type(block).__name__ == CAUSAL_ATTENTION:
        mask = causal_frame_mask(frames, height * width, [r * width for r in rows], x)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    out = out.squeeze(1).reshape(batch, frames, height, width, channels).permute(0, 4, 1, 2, 3)
    return block.proj_out(out) + identity


def _check_norm(norm: nn.Module) -> str | None:
    return None if norm.channel_first else "channel_first=False (only the channels of one position are row-local)"


def _install_causal_conv(module: nn.Module, state: VaeParallel) -> None:
    state.replace(module, lambda x: causal_conv3d_rows(x, module, state.split))


def _install_attention(block: nn.Module, state: VaeParallel) -> None:
    state.replace(block, lambda x: attn_block_rows(block, x, state.split))


RULES = (
    StripRule(
        "HunyuanVideo15CausalConv3d",
        by_class_name("HunyuanVideo15CausalConv3d", "HunyuanImageRefinerCausalConv3d"),
        reason_check(lambda module: check(module, "causal_conv")),
        install=_install_causal_conv,
        owns=lambda m: ("",),  # runs its inner nn.Conv3d itself
    ),
    StripRule(
        "HunyuanVideo15RMS_norm",
        by_class_name("HunyuanVideo15RMS_norm", "HunyuanImageRefinerRMS_norm"),
        reason_check(_check_norm),
    ),
    StripRule("HunyuanVideo15Upsample", by_class_name("HunyuanVideo15Upsample", "HunyuanImageRefinerUpsampleDCAE")),
    StripRule(
        "HunyuanVideo15Downsample",
        by_class_name("HunyuanVideo15Downsample", "HunyuanImageRefinerDownsampleDCAE"),
        height_stride=lambda m: 2,
    ),
    StripRule(
        "HunyuanVideo15AttnBlock",
        by_class_name(CAUSAL_ATTENTION, "HunyuanImageRefinerAttnBlock"),
        install=_install_attention,
        owns=lambda m: ("",),
    ),
)
