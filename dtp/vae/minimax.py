"""AutoencoderKLMiniMaxH3 (MiniMax-H3) on row strips: (B, C, T, H, W) activations, the height (dim 3) split.

Its layers (diffusers `autoencoder_kl_minimax_h3.py`) and why each is exact on strips:
- MiniMaxH3VideoCausalConv3d (an nn.Conv3d): F.pad of H and W by `spatial_padding` in `spatial_padding_mode` (reflect
  in the released checkpoint), zero frames before, then the conv with padding 0. On a strip: halo rows from the
  neighbours, the image's own rows mirrored at its top / bottom only (`conv.rows_for_conv(edge="reflect")`).
- MiniMaxH3VideoDownsample3d: F.pad (0, 1, 0, 1) in the same mode, then its stride-2 conv: one strip conv with row
  padding (0, 1).
- MiniMaxH3VideoGroupNorm: a GroupNorm per frame (frames folded into the batch): the frame's whole-image statistics
  (`norm.group_norm_rows` on the folded strip).
- MiniMaxH3VideoViTDecoder3d: every latent voxel is a token of a non-causal ViT, with learned register tokens and one
  zero token appended (position 0). On strips: each rank embeds its own tokens with their global RoPE positions,
  every rank runs the register / zero tokens (their queries see every token, so they are the same on every rank),
  and each attention gathers the image tokens' K and V from every rank (`ViTRows`); norms, feed-forwards and the
  patch projection act per token. The decoder's output is this rank's rows of every frame.
Tiling (on by default: the released frames are the blended-tile ones) is diffusers' own: each tile's decoder / encoder
call is split over the ranks, so the split reproduces the tiled output too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .conv import rows_for_conv
from .halo import gather_rows
from .norm import group_norm_rows
from .split import Split
from .strip_rule import VaeParallel, named_rule

EDGES = {"reflect": "reflect", "replicate": "replicate", "constant": "zeros", "zeros": "zeros"}  # F.pad -> strip edge


def conv_rows(x: torch.Tensor, conv: nn.Conv3d, split: Split, extra: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """A MiniMaxH3VideoCausalConv3d on a (B, C, T, h, W) strip: this rank's output rows.

    extra: (before, after) rows and columns the Downsample3d pads first, in the same mode ((0, 1) before a stride 2).
    """
    pad, mode = conv.spatial_padding, conv.spatial_padding_mode
    before, after = pad + extra[0], pad + extra[1]
    geometry = dict(kernel=conv.kernel_size[1], stride=conv.stride[1], dilation=conv.dilation[1])
    x = rows_for_conv(x, 3, split, **geometry, pads=(before, after), edge=EDGES[mode])
    if before or after:
        x = F.pad(x, (before, after, 0, 0, 0, 0), mode=mode)
    if conv.temporal_padding:
        x = F.pad(x, (0, 0, 0, 0, conv.temporal_padding, 0))
    return F.conv3d(x, conv.weight, conv.bias, stride=conv.stride, padding=0, dilation=conv.dilation)


def group_norm_frames(x: torch.Tensor, norm: nn.GroupNorm, split: Split) -> torch.Tensor:
    """MiniMaxH3VideoGroupNorm on a strip: frames folded into the batch, each frame's whole-image statistics."""
    batch, channels, frames, height, width = x.shape
    folded = x.permute(0, 2, 1, 3, 4).reshape(batch * frames, channels, 1, height, width)
    out = group_norm_rows(folded, norm, split)
    return out.view(batch, frames, channels, height, width).permute(0, 2, 1, 3, 4).contiguous()


class ViTRows:
    """MiniMaxH3VideoViTDecoder3d on a (B, C, T, h, W) latent strip: diffusers' own forward, with the RoPE positions of
    this rank's rows of the whole grid and every attention on gathered K / V.

    The decoder's forward builds its tokens, register / zero tokens, blocks and unpatchify from the strip's own shape,
    which is right for every per-token step; only its positions (from the strip's height) and its attentions (over
    the strip's tokens) would differ: a pre-hook records the strip, the RoPE module and the attentions are replaced.
    """

    def __init__(self, decoder: nn.Module, split: Split):
        self.decoder, self.split = decoder, split
        self.frames_width: tuple[int, int] = (0, 0)  # of the latent in flight
        self.counts: tuple[int, ...] = ()  # image tokens per rank during a call (T x rows x W)

    def record(self, module: nn.Module, args) -> None:
        """Forward pre-hook on the decoder (it runs before the decoder's entry splits the rows): frames and width."""
        self.frames_width = args[0].shape[2], args[0].shape[4]

    def rope(self, position_ids: torch.Tensor):
        """The RoPE module's forward on the global positions of this rank's tokens (`position_ids`, built from the
        strip's height, only gives the batch and the register / zero tokens' zeros); sets every rank's token count."""
        frames, width = self.frames_width
        bounds = self.split.bounds(self.split.units[self.split.rank])  # the decoder's input is on the latent grid
        start, stop, total = bounds[self.split.rank], bounds[self.split.rank + 1], bounds[-1]
        self.counts = tuple(frames * (b - a) * width for a, b in zip(bounds, bounds[1:]))
        positions = grid_positions(frames, (start, stop, total), width, position_ids.device)
        positions = positions.unsqueeze(0).expand(position_ids.shape[0], -1, -1)
        suffix = position_ids[:, positions.shape[1] :]  # the register / zero tokens' zeros
        rope = self.decoder.rope
        return type(rope).forward(rope, torch.cat([positions, suffix], dim=1))

    def attention(self, attn: nn.Module, hidden: torch.Tensor, rotary=None) -> torch.Tensor:
        """MiniMaxH3VideoAttnProcessor's math with the image tokens' K and V gathered from every rank (rank order:
        softmax over keys does not depend on their order, and there is no mask)."""
        query, key, value = (proj(hidden).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        query = attn.norm_q(query.float()).to(query.dtype)
        key = attn.norm_k(key.float()).to(key.dtype)
        if rotary is not None:
            query, key = _rotate(query, rotary), _rotate(key, rotary)
        local = self.counts[self.split.rank]  # the image tokens come first, then the register / zero tokens
        key, value = (self._gathered(t, local) for t in (key, value))
        out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        return attn.to_out[0](out.transpose(1, 2).flatten(2, 3))

    def _gathered(self, t: torch.Tensor, local: int) -> torch.Tensor:
        """[every rank's image tokens | this rank's register and zero tokens] of a (B, S, heads, D) tensor."""
        whole = gather_rows(t[:, :local].contiguous(), 1, self.counts, self.split.group)
        return torch.cat([whole, t[:, local:]], dim=1)


def grid_positions(frames: int, rows: tuple[int, int, int], width: int, device) -> torch.Tensor:
    """(T x (stop - start) x W, 3) positions (t, h, w), each in [-1, 1) of its whole axis, for the rows
    [start, stop) of `total` (`rows`): diffusers' `2 (arange(0.5, n) / n) - 1` grids, the height cut to the strip."""
    start, stop, total = rows
    axes = [2.0 * (torch.arange(0.5, n, dtype=torch.float32, device=device) / n) - 1.0 for n in (frames, total, width)]
    axes[1] = axes[1][start:stop]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).flatten(0, 2)


def _rotate(x: torch.Tensor, rotary) -> torch.Tensor:
    """The processor's rotary embedding on the first `rotary_dim` channels of every head."""
    cos, sin = (r.to(x.dtype) for r in rotary)
    dim = cos.shape[-1]
    turned, kept = x[..., :dim], x[..., dim:]
    first, second = turned.chunk(2, dim=-1)
    return torch.cat([turned * cos + torch.cat([-second, first], dim=-1) * sin, kept], dim=-1)


def _check_conv(conv: nn.Module) -> str | None:
    if conv.spatial_padding_mode not in EDGES:
        return f"spatial_padding_mode={conv.spatial_padding_mode!r} (split: {', '.join(EDGES)})"
    return None


def _check_downsample(down: nn.Module) -> str | None:
    if down.spatial_stride not in (1, 2) or down.conv.spatial_padding:
        return f"spatial stride {down.spatial_stride} with a conv padding {down.conv.spatial_padding}"
    return _check_conv(down.conv)


def _check_decoder(decoder: nn.Module) -> str | None:
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import MiniMaxH3VideoAttnProcessor

    for name, module in decoder.named_modules():
        processor = getattr(module, "processor", None)
        if type(module).__name__ == "MiniMaxH3VideoAttention" and type(processor) is not MiniMaxH3VideoAttnProcessor:
            return f"{name} running {type(processor).__name__} (the rule is MiniMaxH3VideoAttnProcessor's math)"
    return None


def _install_conv(conv: nn.Module, state: VaeParallel) -> None:
    state.replace(conv, lambda x: conv_rows(x, conv, state.split))


def _install_downsample(down: nn.Module, state: VaeParallel) -> None:
    extra = (0, 1) if down.spatial_stride == 2 else (0, 0)
    state.replace(down, lambda x: conv_rows(x, down.conv, state.split, extra))


def _install_norm(norm: nn.Module, state: VaeParallel) -> None:
    state.replace(norm, lambda x: group_norm_frames(x, norm, state.split))


def _install_decoder(decoder: nn.Module, state: VaeParallel) -> None:
    rows = ViTRows(decoder, state.split)
    state.hooks([decoder.register_forward_pre_hook(rows.record)])
    state.replace(decoder.rope, rows.rope)
    for module in decoder.modules():
        if type(module).__name__ == "MiniMaxH3VideoAttention":
            state.replace(module, lambda hidden, rotary_emb=None, attn=module: rows.attention(attn, hidden, rotary_emb))


RULES = (
    named_rule("MiniMaxH3VideoCausalConv3d", _check_conv, install=_install_conv, height_stride=lambda m: m.stride[1]),
    # runs its conv itself, with the pad before it (whose rule counts the height stride)
    named_rule("MiniMaxH3VideoDownsample3d", _check_downsample, install=_install_downsample, owns=lambda m: ("",)),
    named_rule("MiniMaxH3VideoGroupNorm", install=_install_norm),
    # every layer of it acts per token, except the attentions it runs on gathered K / V
    named_rule("MiniMaxH3VideoViTDecoder3d", _check_decoder, install=_install_decoder, owns=lambda m: ("",)),
)
