"""AutoencoderKLHunyuanVideo on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_hunyuan_video.py`):
- HunyuanVideoCausalConv3d: F.pad(x, (k_w // 2, k_w // 2, k_h // 2, k_h // 2, k_t - 1, 0), mode="replicate"),
  then an nn.Conv3d with padding 0 (stride 2 in H for spatial downsampling). On a strip: the halo rows of the
  neighbours, and at the image's top / bottom its first / last row repeated (`conv.rows_for_conv(edge=
  "replicate")`); time and width padded as the untiled conv pads them (replicate is a per-dim index clamp).
- GroupNorm (resnets, conv_norm_out, the attention's group_norm): global statistics (`norm.py`).
- HunyuanVideoUpsampleCausal3D: nearest x2 in (T, H, W) (the first frame in (H, W)): row-local, then its
  causal conv. HunyuanVideoDownsampleCausal3D: its causal conv with stride 2 in H.
- HunyuanVideoMidBlock3D: single-head attention over all T x H x W positions with a causal mask over frames
  (query frame t sees key frames <= t). On strips: local queries, K and V of every rank gathered, the mask
  rebuilt for (local query frames) x (gathered key frames) -- `mid_block_rows`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .conv import self_padded_conv3d_rows
from .halo import gather_rows
from .norm import group_norm_rows
from .split import Split
from .strip_rule import StripRule, VaeParallel, by_class_name, reason_check

KINDS = {
    "HunyuanVideoCausalConv3d": "causal_conv",
    "HunyuanVideoMidBlock3D": "mid_block",
    "HunyuanVideoUpsampleCausal3D": "upsample",
    "HunyuanVideoDownsampleCausal3D": "downsample",
}
PAD_MODES = {"replicate": "replicate", "constant": "zeros"}  # F.pad mode -> rows_for_conv edge


def layer_kind(module: nn.Module) -> str | None:
    """'causal_conv', 'mid_block', 'upsample', 'downsample' for a HunyuanVideo VAE layer, else None."""
    return KINDS.get(type(module).__name__)


def check(module: nn.Module, kind: str) -> str | None:
    """Why a HunyuanVideo layer has no strip rule (None when it has one)."""
    if kind == "causal_conv":
        conv = module.conv
        if module.pad_mode not in PAD_MODES or conv.padding != (0, 0, 0) or conv.padding_mode != "zeros":
            return f"pad_mode={module.pad_mode!r} with an inner conv padding {conv.padding} ({conv.padding_mode})"
        return None
    if kind == "upsample":
        factor = tuple(module.upsample_factor)
        if any(f not in (1, 2) for f in factor[1:]):
            return f"spatial upsample_factor {factor[1:]} (only 1 or 2 keeps whole rows per strip)"
        return None
    if kind == "mid_block":
        return next(filter(None, (_check_attention(a) for a in module.attentions if a is not None)), None)
    return None


def height_stride(module: nn.Module) -> int:
    """The factor by which a layer divides the height (2 for a spatial downsampler, else 1)."""
    return module.conv.conv.stride[1] if layer_kind(module) == "downsample" else 1


def causal_conv3d_rows(x: torch.Tensor, module: nn.Module, split: Split) -> torch.Tensor:
    """A HunyuanVideoCausalConv3d's forward on a (B, C, T, h, W) strip: this rank's output rows."""
    return self_padded_conv3d_rows(x, module.conv, split, module.time_causal_padding, module.pad_mode)


def mid_block_rows(block: nn.Module, x: torch.Tensor, split: Split) -> torch.Tensor:
    """HunyuanVideoMidBlock3D.forward (no checkpointing) on a (B, C, T, h, W) strip."""
    x = block.resnets[0](x)
    for attn, resnet in zip(block.attentions, block.resnets[1:]):
        if attn is not None:
            x = attention_rows(attn, x, split)
        x = resnet(x)
    return x


def attention_rows(attn: nn.Module, x: torch.Tensor, split: Split) -> torch.Tensor:
    """The mid block's Attention (AttnProcessor2_0 math) on a (B, C, T, h, W) strip: this rank's queries.

    Tokens are (t, row, column) in row-major order on each rank; K and V are gathered in rank order, so
    key j of rank q's block has frame (j - offset_q) // (h_q * W). Mask: 0 where key frame <= query frame,
    -inf elsewhere (diffusers' prepare_causal_attention_mask, for these queries and keys).
    """
    batch, channels, frames, height, width = x.shape
    tokens = x.permute(0, 2, 3, 4, 1).flatten(1, 3)  # (B, T h W, C)
    hidden = group_norm_rows(tokens.transpose(1, 2), attn.group_norm, split).transpose(1, 2)
    query, key, value = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
    rows = split.counts(height)
    counts = tuple(frames * r * width for r in rows)
    key = gather_rows(key.contiguous(), 1, counts, split.group)
    value = gather_rows(value.contiguous(), 1, counts, split.group)
    mask = causal_frame_mask(frames, height * width, [r * width for r in rows], x)
    heads = attn.heads
    query, key, value = (t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (query, key, value))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=attn.scale)
    out = out.transpose(1, 2).flatten(2).to(query.dtype)
    out = attn.to_out[1](attn.to_out[0](out))
    if attn.residual_connection:
        out = out + tokens
    out = out / attn.rescale_output_factor
    return out.unflatten(1, (frames, height, width)).permute(0, 4, 1, 2, 3)


def causal_frame_mask(frames: int, local: int, per_rank: list[int], like: torch.Tensor) -> torch.Tensor:
    """(T local, T sum(per_rank)) additive mask: key frame <= query frame -> 0, else -inf."""
    query_frame = torch.arange(frames, device=like.device).repeat_interleave(local)
    key_frame = torch.cat([torch.arange(frames, device=like.device).repeat_interleave(n) for n in per_rank])
    allowed = key_frame[None, :] <= query_frame[:, None]
    zeros = torch.zeros((), dtype=like.dtype, device=like.device)
    return torch.where(allowed, zeros, torch.full_like(zeros, float("-inf")))


def _check_attention(attn: nn.Module) -> str | None:
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    if not isinstance(attn.processor, (AttnProcessor, AttnProcessor2_0)):
        return f"attention processor {type(attn.processor).__name__} (the rule is AttnProcessor2_0's math)"
    extras = [n for n in ("spatial_norm", "norm_q", "norm_k", "norm_cross") if getattr(attn, n, None)]
    if extras or attn.group_norm is None or attn.is_cross_attention:
        return f"an attention with {extras or 'no group_norm / cross-attention'}"
    return None


def _install_causal_conv(module: nn.Module, state: VaeParallel) -> None:
    state.replace(module, lambda x: causal_conv3d_rows(x, module, state.split))


def _install_mid_block(block: nn.Module, state: VaeParallel) -> None:
    state.replace(block, lambda x: mid_block_rows(block, x, state.split))


def _rule(class_name: str, **fields) -> StripRule:
    kind = KINDS[class_name]
    why = reason_check(lambda module: check(module, kind))
    return StripRule(class_name, by_class_name(class_name), why, **fields)


# The inner nn.Conv3d of a causal conv is still visited (and checked by the Conv3d rule); the mid block's
# attentions are run by `mid_block_rows`, so nothing below `attentions` is visited.
RULES = (
    _rule("HunyuanVideoCausalConv3d", install=_install_causal_conv, owns=lambda m: ("conv",)),
    _rule("HunyuanVideoMidBlock3D", install=_install_mid_block, owns=lambda m: ("attentions",)),
    _rule("HunyuanVideoUpsampleCausal3D"),
    _rule("HunyuanVideoDownsampleCausal3D", height_stride=height_stride),
)
