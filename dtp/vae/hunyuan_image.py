"""AutoencoderKLHunyuanImage (HunyuanImage 2.1) on row strips: (B, C, H, W) images, the height (dim 2) split.

Its layers (diffusers `autoencoder_kl_hunyuanimage.py`): zero-padded Conv2d and GroupNorm (the generic rules of
`image.py`: halo rows, whole-image statistics); HunyuanImageDownsample / HunyuanImageUpsample: a stride-1 conv, then
space-to-depth / depth-to-space by 2 in H (strip bounds are multiples of 2 at every grid: row-local; the downsample
halves the height); the encoder's / decoder's channel-group shortcuts (per position); and the mid block's
HunyuanImageAttentionBlock: one head over all H x W positions, no mask: local queries against the K and V of every
rank (`attention_block_rows`); its GroupNorm keeps the generic rule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .halo import gather_rows
from .split import Split
from .strip_rule import StripRule, VaeParallel, by_class_name


def attention_block_rows(block: nn.Module, x: torch.Tensor, split: Split) -> torch.Tensor:
    """HunyuanImageAttentionBlock.forward on a (B, C, h, W) strip: this rank's queries, every rank's keys (row-major
    order per rank, ranks in order: the softmax over keys does not depend on their order)."""
    identity = x
    x = block.norm(x)  # the generic GroupNorm rule: whole-image statistics
    query, key, value = block.to_q(x), block.to_k(x), block.to_v(x)
    batch, channels, height, width = query.shape
    query, key, value = (t.permute(0, 2, 3, 1).reshape(batch, height * width, channels) for t in (query, key, value))
    counts = tuple(rows * width for rows in split.counts(height))
    key = gather_rows(key.contiguous(), 1, counts, split.group)
    value = gather_rows(value.contiguous(), 1, counts, split.group)
    out = F.scaled_dot_product_attention(query, key, value)
    return block.proj(out.reshape(batch, height, width, channels).permute(0, 3, 1, 2)) + identity


def _install_attention(block: nn.Module, state: VaeParallel) -> None:
    state.replace(block, lambda x: attention_block_rows(block, x, state.split))


RULES = (
    StripRule("HunyuanImageAttentionBlock", by_class_name("HunyuanImageAttentionBlock"), install=_install_attention),
    StripRule("HunyuanImageDownsample", by_class_name("HunyuanImageDownsample"), height_stride=lambda m: 2),
    StripRule("HunyuanImageUpsample", by_class_name("HunyuanImageUpsample")),
)
