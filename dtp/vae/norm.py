"""GroupNorm over row strips with the statistics of the whole image, never of one strip.

GroupNorm normalizes each (sample, group) over its channels and *all* positions. Each rank has
n_r positions of it with mean m_r and variance v_r (`torch.var_mean`, biased); one all_gather of
(n_r, m_r, v_r) and Chan's parallel combination give the untiled statistics:

    n = sum n_r,   m = sum n_r m_r / n,   v = sum n_r (v_r + (m_r - m)^2) / n

(no E[x^2] - E[x]^2 cancellation). Then y = (x - m) / sqrt(v + eps) * weight + bias per channel.
Statistics are computed in fp32 whatever the activation dtype.

Speed on CPU (one thread, the parallel decode's budget): `torch.var_mean` reduces with a scalar Welford
loop, ~3x the time of `torch.batch_norm_update_stats` (two vectorized passes, sum then sum of squared
deviations: the same biased variance, no cancellation either), which reads the (B, G, L) groups as a
(1, B*G, L) batch of B*G channels. A strip that arrives channels-last (diffusers' attention output is a
transposed view) is made contiguous once here, so the output, and every layer after it, is contiguous,
as torch's GroupNorm makes it in the untiled decode.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from .split import Split

UPCAST_CHUNKS = 8  # pieces a non-fp32 strip is normalized in (fp32 math on each, in turn): see `_group_chunks`


def local_stats(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(3, B, G): count, mean and biased variance of each (sample, group) over this rank's positions."""
    grouped = x.reshape(x.shape[0], groups, -1)
    parts = [_moments(part.float()) for part in _group_chunks(grouped, 1)]
    mean, var = (torch.cat(column, dim=1) for column in zip(*parts))
    return torch.stack([torch.full_like(mean, grouped.shape[-1]), mean, var])


def _group_chunks(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, ...]:
    """`x` whole when it is fp32, else in UPCAST_CHUNKS pieces along `dim` (whole groups), so that the fp32 copy a
    bf16 / fp16 strip is computed in never exceeds 2 / UPCAST_CHUNKS of the strip's own bytes (whole, it was 2x:
    the parallel decode's peak per rank was twice the fp32-free share, 1.61 GB instead of 0.80 at FLUX.1 2048^2,
    bf16, N = 8). Each group's moments and each element's affine are computed alone, so the pieces change nothing."""
    return (x,) if x.dtype == torch.float32 else x.chunk(UPCAST_CHUNKS, dim=dim)


def _moments(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, biased variance) over the last dim of a contiguous (B, G, L) tensor, each (B, G)."""
    if grouped.device.type != "cpu" or not _eager(grouped):  # CUDA's var_mean is one fast pass
        var, mean = torch.var_mean(grouped, dim=-1, unbiased=False)
        return mean, var
    batch, groups, length = grouped.shape
    mean, var = torch.batch_norm_update_stats(grouped.view(1, batch * groups, length), None, None, 0.0)
    return mean.view(batch, groups), var.view(batch, groups)


def _eager(x: torch.Tensor) -> bool:
    """Whether `x` holds data computed now: not a fake tensor (dtp fit's traces; batch-norm-stats has no fake kernel,
    and FakeTensorMode would run the real one on a real zero tensor of the full size) and not under torch.compile
    (dynamo's fake tensors refuse it: a graph break at every GroupNorm)."""
    return not torch.compiler.is_compiling() and not is_fake(x)


def combine(stats: torch.Tensor, split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole image's (mean, variance) per (sample, group) from every rank's `local_stats`."""
    parts = [torch.empty_like(stats) for _ in range(split.world)]
    dist.all_gather(parts, stats.contiguous(), group=split.group)
    count, mean, var = torch.stack(parts).unbind(1)  # each (world, B, G)
    total = count.sum(0)
    global_mean = (count * mean).sum(0) / total
    global_var = (count * (var + (mean - global_mean) ** 2)).sum(0) / total
    return global_mean, global_var


def group_norm_rows(x: torch.Tensor, norm: nn.GroupNorm, split: Split) -> torch.Tensor:
    """`norm(x)` for a strip (B, C, *positions) of any rank: global statistics, this rank's positions.

    Applied as torch's own kernel does: y = x * scale + shift per (sample, channel), with
    scale = weight / sqrt(v + eps) and shift = bias - m * scale (one output tensor, no temporaries).
    """
    x = x.contiguous()
    batch, channels, groups = x.shape[0], x.shape[1], norm.num_groups
    mean, var = combine(local_stats(x, groups), split)
    rstd = torch.rsqrt(var + norm.eps).repeat_interleave(channels // groups, dim=1)  # (B, C)
    mean = mean.repeat_interleave(channels // groups, dim=1)
    scale = rstd * norm.weight.float() if norm.affine else rstd
    shift = -scale * mean + (norm.bias.float() if norm.affine else 0.0)
    shape = (batch, channels) + (1,) * (x.dim() - 2)
    shift, scale = shift.reshape(shape), scale.reshape(shape)
    if x.dtype == torch.float32:
        return torch.addcmul(shift, x, scale)
    out = torch.empty_like(x)
    step = -(-groups // UPCAST_CHUNKS) * (channels // groups)  # whole groups per piece, as `_group_chunks` cuts
    for start in range(0, channels, step):
        piece = slice(start, start + step)
        out[:, piece].copy_(torch.addcmul(shift[:, piece], x[:, piece].float(), scale[:, piece]))
    return out
