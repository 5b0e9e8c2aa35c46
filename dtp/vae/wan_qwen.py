"""The causal video VAEs' layers (AutoencoderKLWan, AutoencoderKLQwenImage, AutoencoderKLQwenImage21) on row strips:
height split, time untouched. Their `_decode` loop is split one level up (`video_decode.py`).

Their activations are (B, C, T, H, W); the strips split H (dim 3). Each diffusers class family has the
same layers under its own prefix (`WanCausalConv3d`, `QwenImageCausalConv3d`, ...):
- CausalConv3d: time padded causally (2 p_t frames before, or the frames cached from the previous
  chunk), H by the strip rule (halo rows of the time-extended input, `conv.rows_for_conv`), W as is.
  The temporal caches (`feat_cache`) hold the inputs' last frames, i.e. this rank's rows of them: the
  caches are kept per strip, and the halo is exchanged on the cache-extended tensor, as the conv sees it.
- RMS_norm: normalizes over channels at each position: row-local, nothing to exchange.
- Resample: nearest(-exact) x2 upsampling (row-local) then a 3x3 conv on (B*T, C, H, W) frames; or
  downsampling by ZeroPad2d((0, 1, 0, 1)) + a stride-2 conv, run as one strip conv with row padding (0, 1).
- AttentionBlock: single-head attention per frame over all H x W positions: local queries, K and V
  gathered over ranks (`attention.py`'s rule, here written out for the block's fused to_qkv).
- Qwen-Image 2.1's VAE (AutoencoderKLQwenImage21): Wan 2.2's layout for one frame; its CausalConv3d is an
  nn.Conv2d on that frame (squeeze(2), F.pad (w, w, h, h), conv): the same strip conv in 2-D (`causal_conv2d_rows`).
- Wan 2.2's residual shortcuts (is_residual=True): space-to-depth (AvgDown3D: mean over channel groups of
  f_t x f_s x f_s blocks) and depth-to-space (DupUp3D) by f_s in H. Strip bounds are multiples of f_s at
  every grid (strips.py), so each strip maps to whole rows: row-local.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PlanError
from .conv import conv2d_rows, self_padded_conv3d_rows
from .halo import gather_rows
from .split import Split
from .strip_rule import StripRule, VaeParallel, by_class_name

# Class-name prefixes of the causal video VAEs' layers (the longest first: QwenImage21Resample is no QwenImage one).
FAMILIES = ("Wan", "QwenImage21", "QwenImage")


def layer_kind(module: nn.Module) -> str | None:
    """'causal_conv', 'rms_norm', 'upsample', 'resample', 'attention' for a video-VAE layer, else None."""
    name = type(module).__name__
    for family in FAMILIES:
        if name.startswith(family):
            kind = name[len(family) :]
            return {
                "CausalConv3d": "causal_conv",
                "RMS_norm": "rms_norm",
                "Upsample": "upsample",
                "Resample": "resample",
                "AttentionBlock": "attention",
            }.get(kind)
    return None


def causal_conv3d_rows(x: torch.Tensor, conv: nn.Conv3d, split: Split, cache_x=None) -> torch.Tensor:
    """A Wan-style CausalConv3d's forward on a (B, C, T, h, W) strip: this rank's output rows.

    conv._padding = (w, w, h, h, 2 p_t, 0) as F.pad takes it; conv.padding is (0, 0, 0).
    """
    padding = list(conv._padding)
    cache = cache_x.to(x.device) if cache_x is not None and padding[4] > 0 else None
    return self_padded_conv3d_rows(x, conv, split, padding, cache=cache)


def causal_conv2d_rows(x: torch.Tensor, conv: nn.Conv2d, split: Split, cache_x=None) -> torch.Tensor:
    """Qwen-Image 2.1's CausalConv3d, an nn.Conv2d on its one frame, on a (B, C, 1, h, W) strip: this rank's rows.

    conv._padding = (w, w, h, h) as F.pad takes it; conv.padding is (0, 0). Like diffusers' forward, it refuses a
    temporal cache (there is no time to pad).
    """
    if cache_x is not None:
        raise ValueError(f"{type(conv).__name__} is an image convolution: it takes no feature cache.")
    w_left, w_right, h_top, h_bottom = conv._padding
    out = conv2d_rows(x.squeeze(2), conv, split, row_pad=(h_top, h_bottom), width_pad=(w_left, w_right))
    return out.unsqueeze(2)


def downsample_rows(x: torch.Tensor, conv: nn.Conv2d, split: Split) -> torch.Tensor:
    """Sequential(ZeroPad2d((0, 1, 0, 1)), Conv2d(stride 2, padding 0)) on a (B*T, C, h, W) strip."""
    return conv2d_rows(x, conv, split, row_pad=(0, 1), width_pad=(0, 1))


def attention_block_rows(block: nn.Module, x: torch.Tensor, split: Split) -> torch.Tensor:
    """The AttentionBlock's forward on a (B, C, T, h, W) strip: per frame, local queries over all keys.

    Same steps as diffusers' WanAttentionBlock.forward, with K and V of every rank's rows gathered
    along the sequence (rank order = row-major order) before the attention.
    """
    identity = x
    batch, channels, time, height, width = x.shape
    x = x.permute(0, 2, 1, 3, 4).reshape(batch * time, channels, height, width)
    x = block.norm(x)
    qkv = block.to_qkv(x).reshape(batch * time, 1, channels * 3, -1).permute(0, 1, 3, 2).contiguous()
    q, k, v = qkv.chunk(3, dim=-1)
    counts = tuple(c * width for c in split.counts(height))
    k = gather_rows(k.contiguous(), 2, counts, split.group)
    v = gather_rows(v.contiguous(), 2, counts, split.group)
    x = F.scaled_dot_product_attention(q, k, v)
    x = x.squeeze(1).permute(0, 2, 1).reshape(batch * time, channels, height, width)
    x = block.proj(x)
    x = x.view(batch, time, channels, height, width).permute(0, 2, 1, 3, 4)
    return x + identity


def check_resample(resample: nn.Module) -> str | None:
    """Why a Resample has no strip rule (None when it has one)."""
    seq = resample.resample
    if resample.mode in ("upsample2d", "upsample3d"):
        up, conv = seq[0], seq[1]
        if up.mode not in ("nearest", "nearest-exact") or tuple(up.scale_factor) != (2.0, 2.0):
            return f"upsampling {up.mode} x {up.scale_factor}"
        return None
    if resample.mode in ("downsample2d", "downsample3d"):
        pad, conv = seq[0], seq[1]
        if not isinstance(pad, nn.ZeroPad2d) or tuple(pad.padding) != (0, 1, 0, 1) or conv.padding != (0, 0):
            return f"downsampling by {pad} then {conv}"
        return None
    return None if resample.mode == "none" else f"mode {resample.mode}"


def _is_downsampling(resample: nn.Module) -> bool:
    return resample.mode.startswith("downsample")


def _check_rms_norm(norm: nn.Module, path: str) -> None:
    if not norm.channel_first:
        raise PlanError(
            f"parallelize_vae: {path} normalizes over the last dim; only channel-first RMS_norm is row-local."
        )


def _check_resample(resample: nn.Module, path: str) -> None:
    reason = check_resample(resample)
    if reason is not None:
        raise PlanError(f"parallelize_vae: {path} ({type(resample).__name__}) has no row-strip rule for {reason}.")


def _install_resample(resample: nn.Module, state: VaeParallel) -> None:
    """Downsampling: ZeroPad2d + stride-2 conv as one strip conv; upsampling is row-local (its conv is a child)."""
    if _is_downsampling(resample):
        seq = resample.resample
        state.replace(seq, lambda x: downsample_rows(x, seq[1], state.split))


def _check_causal_conv(conv: nn.Module, path: str) -> None:
    if conv.padding_mode != "zeros":
        raise PlanError(f"parallelize_vae: {path} pads with padding_mode={conv.padding_mode!r}; only zeros is split.")


def _install_causal_conv(conv: nn.Module, state: VaeParallel) -> None:
    rows = causal_conv2d_rows if isinstance(conv, nn.Conv2d) else causal_conv3d_rows  # Qwen-Image 2.1's is 2-D
    state.replace(conv, lambda x, cache_x=None: rows(x, conv, state.split, cache_x))


def _install_attention(block: nn.Module, state: VaeParallel) -> None:
    state.replace(block, lambda x: attention_block_rows(block, x, state.split))


def _kind(kind: str):
    return lambda module: layer_kind(module) == kind


RULES = (
    StripRule("causal conv", _kind("causal_conv"), _check_causal_conv, install=_install_causal_conv),
    StripRule("RMS_norm", _kind("rms_norm"), _check_rms_norm),
    StripRule("upsample", _kind("upsample")),
    StripRule(
        "resample",
        _kind("resample"),
        _check_resample,
        install=_install_resample,
        owns=lambda m: ("resample",) if _is_downsampling(m) else (),  # its causal `time_conv` keeps its own rule
        height_stride=lambda m: 2 if _is_downsampling(m) else 1,
    ),
    StripRule("attention block", _kind("attention"), install=_install_attention, owns=lambda m: ("",)),
    StripRule(
        "space-to-depth / depth-to-space",
        by_class_name("AvgDown3D", "DupUp3D", "QwenImage21AvgDown3D", "QwenImage21DupUp3D"),
    ),
)
