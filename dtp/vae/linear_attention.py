"""AutoencoderDC's multiscale ReLU linear attention (diffusers' `SanaMultiscaleLinearAttention`) on row strips.

Per head, with ReLU kernels q = relu(Q), k = relu(K) over the N tokens of the whole image (diffusers'
`SanaMultiscaleAttnProcessor2_0`, `apply_linear_attention`):

    scores = [V; 1] @ k^T        [d + 1, d]: a SUM over all N tokens (the 1-row sums k over the tokens)
    out    = scores @ q          [d + 1, N_q]: per query token
    out    = out[:d] / (out[d] + eps)

Only `scores` mixes tokens, and it is a plain sum: each rank sums over its own rows' tokens and one SUM all-reduce
gives every rank the whole image's `scores`; the rest runs on its own queries. Per call one all-reduce of
[B, heads, d + 1, d] fp32 values (DC-AE f32c32 at its 1024-channel levels: 32 heads x 2 scales x 33 x 32 x 4 B =
270 KB per sample), whatever the image size. The partial sums add in another order than one process's matmul:
~1e-7 relative.

diffusers switches to a softmax-free *quadratic* form when the image has at most `attention_head_dim` tokens
(H W <= d): scores = k^T q normalised over the keys, out = V scores. That needs every key and value, so they are
gathered (the image is at most d tokens there). The switch reads the WHOLE image's H W on every rank, never the
strip's (a strip of a large image can hold <= d tokens).

Everything else of the layer is row-local or has its own rule: to_q / to_k / to_v / to_out (Linear, per position),
the multiscale projections (a depthwise k x k Conv2d with zero padding k // 2: the Conv2d strip rule, halo rows;
then a 1 x 1 grouped Conv2d), norm_out (RMSNorm channel-last or BatchNorm2d with running statistics), the residual.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .halo import gather_rows
from .split import Split

PROCESSOR = "SanaMultiscaleAttnProcessor2_0"  # the processor whose math `multiscale_attention_rows` is


def reduce_sums(scores: torch.Tensor, split: Split) -> torch.Tensor:
    """The whole image's [V; 1] k^T from every rank's partial one: a SUM all-reduce over the VAE's ranks."""
    dist.all_reduce(scores, op=dist.ReduceOp.SUM, group=split.group)
    return scores


def multiscale_attention_rows(attn: nn.Module, x: torch.Tensor, split: Split) -> torch.Tensor:
    """`attn(x)` (SanaMultiscaleAttnProcessor2_0) for a (B, C, h, W) strip: this rank's rows of the whole layer."""
    batch, _, rows, width = x.shape
    linear = split.bounds(rows)[-1] * width > attn.attention_head_dim  # the whole image's token count decides
    original_dtype = x.dtype
    hidden = x.movedim(1, -1)
    qkv = torch.cat([attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)], dim=3).movedim(-1, 1)
    qkv = torch.cat([qkv] + [block(qkv) for block in attn.to_qkv_multiscale], dim=1)
    if linear:
        qkv = qkv.float()
    qkv = qkv.reshape(batch, -1, 3 * attn.attention_head_dim, rows * width)
    query, key, value = qkv.chunk(3, dim=2)
    query, key = attn.nonlinearity(query), attn.nonlinearity(key)
    if linear:
        out = _linear(attn, query, key, value, split).to(original_dtype)
    else:
        out = _quadratic(attn, query, key, value, split, width)
    out = attn.to_out(out.reshape(batch, -1, rows, width).movedim(1, -1)).movedim(-1, 1)
    if attn.norm_type == "rms_norm":
        out = attn.norm_out(out.movedim(1, -1)).movedim(-1, 1)
    else:
        out = attn.norm_out(out)
    return out + x if attn.residual_connection else out


def _linear(attn: nn.Module, query, key, value, split: Split) -> torch.Tensor:
    """`apply_linear_attention` with the token sum all-reduced: (B, heads, d, n) per local query token."""
    value = torch.nn.functional.pad(value, (0, 0, 0, 1), mode="constant", value=1)
    scores = reduce_sums(torch.matmul(value, key.transpose(-1, -2)), split)  # the only step that mixes tokens
    out = torch.matmul(scores, query).float()
    return out[:, :, :-1] / (out[:, :, -1:] + attn.eps)


def _quadratic(attn: nn.Module, query, key, value, split: Split, width: int) -> torch.Tensor:
    """`apply_quadratic_attention` for local queries against every rank's keys and values (tokens gathered in rank
    order = the image's row-major order)."""
    counts = tuple(rows * width for rows in split.counts(query.shape[-1] // width))
    key = gather_rows(key, 3, counts, split.group)
    value = gather_rows(value, 3, counts, split.group)
    scores = torch.matmul(key.transpose(-1, -2), query).float()
    scores = scores / (torch.sum(scores, dim=2, keepdim=True) + attn.eps)
    return torch.matmul(value, scores.to(value.dtype))
