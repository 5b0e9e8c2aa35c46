"""Cutting a tensor into its `cp` sequence chunk, and putting the chunks back together.

Rank r of a `cp`-rank group keeps `x.narrow(dim, r * n // cp, n // cp)`: contiguous chunks in rank
order, so `cat([chunk_0, ..., chunk_{cp-1}], dim)` is `x` again. Example: n = 24 image tokens,
cp = 4 -> rank 2 holds tokens 12..17. A length `cp` does not divide is refused (ForwardError naming
the length and the degree) rather than padded: padding would add tokens every attention sees, unless
the plan marks the split `pad` (`padded_chunk`) and its attention masks the pad keys (`PadState`).
"""

from __future__ import annotations

import torch

from ...errors import ForwardError
from ...styles.collectives import all_gather_along


def local_chunk(x: torch.Tensor, dim: int, rank: int, cp: int, what: str, expected_dims: int | None = None):
    """This rank's chunk of `x` along `dim`; `what` names the tensor in errors."""
    if expected_dims is not None and x.ndim != expected_dims:
        raise ForwardError(
            f"cp split of {what}: expected a {expected_dims}-D tensor, got shape {tuple(x.shape)}; the plan's "
            f"`expected_dims` does not match how this model is called."
        )
    n = x.shape[dim]
    if n % cp:
        raise ForwardError(
            f"cp split of {what}: sequence length {n} (dim {dim}) is not divisible by the cp degree {cp}; "
            f"use a length that is a multiple of {cp} (e.g. {n + (-n) % cp}) or a smaller cp."
        )
    size = n // cp
    return x.narrow(dim, rank * size, size)


def own_chunk(x: torch.Tensor, dim: int, rank: int, cp: int, what: str, expected_dims: int | None = None):
    """`local_chunk` copied out of `x`: for a module's output, which only the hook sees whole, so the whole
    tensor is freed as the hook returns (a view would keep it alive through the first block)."""
    return local_chunk(x, dim, rank, cp, what, expected_dims).clone(memory_format=torch.contiguous_format)


def flat_chunk(x: torch.Tensor, dim: int, rank: int, cp: int, what: str, expected_dims: int | None = None):
    """This rank's chunk of `x`'s token grid (dims `dim`.. flattened), copied and shaped [..., 1, ..., L].

    x [B, C, F, H, W], dim 2, cp 8, F H W = 21 x 30 x 52 = 32760 tokens: rank r gets tokens
    [4095 r, 4095 (r + 1)) of the F-major order as [B, C, 1, 1, 4095]; `flatten(2)` of that is the rank's
    [B, C, 4095]. A copy, so the caller dropping `x` frees the whole grid.
    """
    if expected_dims is not None and x.ndim != expected_dims:
        raise ForwardError(
            f"cp split of {what}: expected a {expected_dims}-D tensor, got shape {tuple(x.shape)}; the plan's "
            f"`expected_dims` does not match how this model is called."
        )
    chunk = local_chunk(x.flatten(dim), dim, rank, cp, what).clone(memory_format=torch.contiguous_format)
    return chunk.reshape(*x.shape[:dim], *([1] * (x.ndim - dim - 1)), chunk.shape[dim])


def dense(x: torch.Tensor) -> torch.Tensor:
    """`x.contiguous()` in a form that also runs on fake CUDA tensors (where `Tensor.contiguous` raises on a CPU-only
    torch): `x` itself when it is contiguous, else a contiguous copy."""
    return x if x.is_contiguous() else x.clone(memory_format=torch.contiguous_format)


def gather_chunks(x: torch.Tensor, dim: int, group, what: str, expected_dims: int | None = None) -> torch.Tensor:
    """All-gather every rank's chunk of `x` on `group` and concatenate them along `dim`, in rank order."""
    if expected_dims is not None and x.ndim != expected_dims:
        raise ForwardError(f"cp gather of {what}: expected a {expected_dims}-D tensor, got shape {tuple(x.shape)}.")
    return all_gather_along(dense(x), group, dim)


def padded_chunk(x: torch.Tensor, dim: int, rank: int, cp: int, what: str, expected_dims: int | None = None):
    """`(chunk, valid)`: this rank's chunk of `x` zero-padded along `dim` to a multiple of cp, and how many
    of the chunk's leading tokens are real. n = 226, cp = 4: chunks of 57; ranks 0-2 valid 57, rank 3 55.
    Only the rank's chunk is padded (its real rows, then zeros): the padded whole is never built, so no rank holds a
    whole copy of the sequence alive through the first block (ConsisID's video, 0.108 GB at cp=8, was one)."""
    if expected_dims is not None and x.ndim != expected_dims:
        local_chunk(x, dim, rank, cp, what, expected_dims)  # raises the shape error
    n = x.shape[dim]
    size = -(-n // cp)
    valid = max(0, min(size, n - rank * size))
    chunk = x.narrow(dim, min(rank * size, n), valid)
    if size * cp == n:  # nothing padded: a view, as `local_chunk`
        return chunk, valid
    # padded: a copy on every rank, as the padded whole's cut was (a view of the caller's tensor on the ranks without
    # pad rows let an in-place op downstream write into it)
    zeros = x.new_zeros(*x.shape[:dim], size - valid, *x.shape[dim + 1 :])
    return torch.cat([chunk, zeros], dim=dim), valid
