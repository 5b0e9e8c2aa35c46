"""Ulysses attention: trade the sequence split for a head split with two all-to-alls.

Each of the `cp` ranks holds q, k, v of shape `[B, S/cp, H, D]` (H = heads after TP, so the rule is
`(heads / tp) % cp == 0`). The first all-to-all sends head group j to rank j and receives every
rank's sequence chunk of this rank's heads: `[B, S, H/cp, D]`, sequence in rank order. Attention then
runs unchanged on whole sequences (any diffusers backend), and the second all-to-all sends each
sequence chunk back home: `[B, S/cp, H, D]`. Example: S = 24, H = 4, cp = 2 -> each rank attends
24 tokens x 2 heads.

Token order inside the gathered sequence is [chunk of rank 0, chunk of rank 1, ...]; with joint
attention each chunk is [text_r, image_r], a permutation of the reference order. Softmax attention
does not depend on the order of keys as long as every key keeps its own mask entry and RoPE phase
(both computed per local token before the exchange), and each query's output is routed back to the
rank it came from, so the result equals the reference up to float rounding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import ForwardError
from .masks import gather_key_mask


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """`[B, S/cp, H, D]` (local sequence, all heads) -> `[B, S, H/cp, D]` (all sequence, local heads)."""
    cp = dist.get_world_size(group)
    b, s, h, d = x.shape
    if h % cp:
        raise ForwardError(
            f"Ulysses attention: {h} heads per rank (after tp) are not divisible by cp={cp}; "
            f"use cp_mode='ring' or a cp that divides {h}."
        )
    send = x.reshape(b, s, cp, h // cp, d).permute(2, 0, 1, 3, 4).contiguous()  # [cp (dest), B, s, h/cp, D]
    recv = torch.empty_like(send)  # [cp (source = sequence chunk), B, s, h/cp, D]
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3, 4).reshape(b, cp * s, h // cp, d)


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """Inverse of `seq_to_heads`: `[B, S, H/cp, D]` -> `[B, S/cp, H, D]`."""
    cp = dist.get_world_size(group)
    b, s_full, h_local, d = x.shape
    s = s_full // cp
    send = x.reshape(b, cp, s, h_local, d).permute(1, 0, 2, 3, 4).contiguous()  # [cp (dest), B, s, h/cp, D]
    recv = torch.empty_like(send)  # [cp (source = head group), B, s, h/cp, D]
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s, cp * h_local, d)


def ulysses_attention(query, key, value, mask, *, group, attend) -> torch.Tensor:
    """Attention over the whole `cp`-split sequence; `attend(q, k, v, attn_mask)` runs on full sequences.

    mask: this rank's `[B, S/cp]` key mask or None; it is gathered and passed as `[B, 1, 1, S]`.
    """
    q, k, v = (seq_to_heads(t, group) for t in (query, key, value))
    full_mask = gather_key_mask(mask, group)
    out = attend(q, k, v, None if full_mask is None else full_mask[:, None, None, :])
    return heads_to_seq(out.contiguous(), group)
