"""A strided cut for a per-sample tensor repeated once per token: rank r keeps rows r, r + cp, r + 2 cp, ...

Latte hands its temporal blocks `timestep_temp` = the per-sample modulation repeated for every token position
([B x P, 6 D], sample-major), while under CP each rank's temporal batch is its P / cp token positions of every
sample ([B x P / cp, F, D]). The batch B is not known to the hook, but it need not be: with P % cp == 0, local row k
of the strided cut is global row k cp + r, which lies in sample k // (P / cp), the sample of the rank's row k. The
rows of one sample are all equal (a repeat), so the cut is exact.

Example: B = 2, P = 4, cp = 2 (rows a a a a b b b b): rank 1 keeps rows 1, 3, 5, 7 = a a b b, one row for each of
its 2 token positions of each sample.
"""

from __future__ import annotations

import torch

from ...errors import ForwardError


def strided_chunk(x, dim: int, rank: int, cp: int, what: str, expected_dims: int | None = None) -> torch.Tensor:
    """Rows rank, rank + cp, ... of `x` along `dim` (see the module docstring)."""
    if not isinstance(x, torch.Tensor) or (expected_dims is not None and x.ndim != expected_dims):
        raise ForwardError(
            f"cp split of {what}: expected a {expected_dims or 'any'}-D tensor, got {getattr(x, 'shape', type(x))}."
        )
    n = x.shape[dim]
    if n % cp:
        raise ForwardError(f"cp split of {what}: {n} rows (dim {dim}) do not divide by the cp degree {cp}.")
    return x.unflatten(dim, (n // cp, cp)).select(dim + 1, rank)
