"""A split at a global token index: a sequence [head | tail] whose tail length is an int input of the module.

Helios' blocks hold [history | current] tokens and split them at `original_context_length` (the current count,
a global int passed to every block and to the output norm): cross-attention and the output norm run on the current
tokens only. A contiguous cut of the joint sequence would leave the split point inside one rank's chunk and hand
every rank the global count. Instead head and tail are cut on their own, and rank r keeps [head_r | tail_r]: a
permutation of the sequence that every per-token op and softmax attention (whose keys carry their own RoPE rows)
do not see, and the tail's chunks gathered in rank order are the tail again. The count itself is cut with
`count: true`: the rank's tail length, so `hidden_states.shape[1] - original_context_length` is its head length.

Example: 40 history + 24 current tokens, cp = 4: rank 1 keeps history 10..19 and current 6..11 (global tokens
46..51), 16 tokens, and is told original_context_length = 6.

With `pad` (`PadRule`), head and tail are each zero-padded to a multiple of cp, as the `first` and the `last`
padded sequence of the forward (`hooks.PadState`): the attentions the rule lists mask both pad runs among their keys
([head_r (valid, pad) | tail_r (valid, pad)]), and a gather with `trim: last` drops the tail's pad rows. 2054
history + 32760 current tokens, cp = 8: history padded to 2056 (257 a rank; rank 7 holds 255 real), current 4095.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ForwardError
from .sequence import local_chunk, padded_chunk


@dataclass(frozen=True)
class Piece:
    """One of the two runs of a rank's [head_r | tail_r]: `local` tokens held (pad included), the first `valid`
    real, `total` the run's unpadded global length."""

    local: int
    valid: int
    total: int


def tail_chunk(x, dim: int, tail, rank: int, cp: int, what: str, expected_dims: int | None = None, pad: bool = False):
    """`(chunk, head, tail)`: this rank's [head_r | tail_r] of `x` = [head | tail] along `dim` (the tail `tail`
    long) and the two `Piece`s; with `pad`, each run zero-padded to a multiple of cp first, else a run cp does not
    divide is a ForwardError."""
    if not isinstance(x, torch.Tensor) or (expected_dims is not None and x.ndim != expected_dims):
        raise ForwardError(
            f"cp split of {what}: expected a {expected_dims or 'any'}-D tensor, got {getattr(x, 'shape', type(x))}."
        )
    if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= x.shape[dim]:
        raise ForwardError(
            f"cp split of {what}: the tail length must be an int in [0, {x.shape[dim]}] (dim {dim}), got {tail!r}."
        )
    runs = x.split([x.shape[dim] - tail, tail], dim=dim)
    chunks, pieces = [], []
    for run, part in zip(runs, ("head", "tail")):
        if pad:
            chunk, valid = padded_chunk(run, dim, rank, cp, f"{what} ({part})")
        else:
            chunk = local_chunk(run, dim, rank, cp, f"{what} ({part})")
            valid = chunk.shape[dim]
        chunks.append(chunk)
        pieces.append(Piece(chunk.shape[dim], valid, run.shape[dim]))
    return torch.cat(chunks, dim), pieces[0], pieces[1]
