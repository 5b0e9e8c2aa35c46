"""Ulysses attention: trade the sequence split for a head split with two all-to-alls.

Each of the `cp` ranks holds q, k, v of shape `[B, S/cp, H, D]` (H = heads after TP, so the rule is
`(heads / tp) % cp == 0`). The first all-to-all sends head group j of q, k and v, stacked into one message,
to rank j and receives every rank's sequence chunk of this rank's heads: `[B, S, H/cp, D]` each, sequence in
rank order. Attention then runs unchanged on whole sequences (any diffusers backend), and the second all-to-all
sends each sequence chunk back home: `[B, S/cp, H, D]`. Example: S = 24, H = 4, cp = 2 -> each rank attends
24 tokens x 2 heads; 2 all-to-alls per attention (q, k and v sent apart would be 4).

Stacking needs q, k, v of one shape; k / v with fewer heads (GQA) or another head dim than q go in one
all-to-all each (`to_heads` falls back; 4 per attention then).

Token order inside the gathered sequence is [chunk of rank 0, chunk of rank 1, ...]; with joint
attention each chunk is [text_r, image_r], a permutation of the reference order. Softmax attention
does not depend on the order of keys as long as every key keeps its own mask entry and RoPE phase
(both computed per local token before the exchange), and each query's output is routed back to the
rank it came from, so the result equals the reference up to float rounding.
The all-to-alls are the ProcessGroup's own in eager and functional collectives under torch.compile (traced), one
helper for both (`styles.collectives.all_to_all`): a functional all-to-all cost ~260 µs of host in eager, the
ProcessGroup call ~7 µs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import _AttentionBackendRegistry

from ...errors import ForwardError
from ...styles.collectives import all_to_all
from .masks import gather_key_mask
from .sequence import dense


def _refuse_heads(heads: int, cp: int) -> None:
    raise ForwardError(
        f"Ulysses attention: {heads} heads per rank (after tp) are not divisible by cp={cp}; "
        f"use cp_mode='ring' or a cp that divides {heads}."
    )


def stacked_to_heads(tensors, group, heads_first: bool = False) -> tuple[torch.Tensor, ...]:
    """N tensors `[B, S/cp, H, D]` (the local sequence, all heads) -> N tensors `[B, S, H/cp, D]` (all sequence,
    local heads) in one all-to-all: the send is `[cp (dest), B, s, N, H/cp, D]`, the N tensors stacked and laid out
    by one view and one permute (4 ops; a stack of N permuted views is 2 N + 1: 10.4 against 6.7 µs of host at N = 3
    on one core; it copies the stack once more, a device pass over q, k and v where host time is not the bound).
    At B = 1 the received `[cp (source), 1, s, N, H/cp, D]` is already
    `[1, S, N, H/cp, D]`: the N results are views of it, with no copy (strided along the sequence, as attention
    kernels take them); at B > 1 one copy lays it out. The send is dropped once received: the activation peak holds
    two N-tensor buffers besides the inputs, as the three one-tensor exchanges did at most. Host time is the cost
    that matters at these sizes, so the op count is kept low (`all_to_all` splits dim 0 as it is, no flatten).
    heads_first: the N results as `[B, H/cp, S, D]` views instead (one permute before the unbind, no transpose
    each), the layout torch's SDPA takes."""
    cp = group.size()
    b, s, h, d = tensors[0].shape
    if h % cp:
        _refuse_heads(h, cp)
    n = len(tensors)
    send = dense(torch.stack(tensors, dim=2).view(b, s, n, cp, h // cp, d).permute(3, 0, 1, 2, 4, 5))
    recv = all_to_all(send, group)
    del send  # [cp (source), B, s, N, ...] received: the send buffer is free before the result is laid out
    if b == 1:
        whole = recv.view(1, cp * s, n, h // cp, d)
    else:
        whole = recv.transpose(0, 1).reshape(b, cp * s, n, h // cp, d)
    return whole.permute(2, 0, 3, 1, 4).unbind(0) if heads_first else whole.unbind(2)


def to_heads(query, key, value, group, heads_first: bool = False):
    """q, k, v `[B, S/cp, H, D]` -> `[B, S, H/cp, D]` each (`[B, H/cp, S, D]` with `heads_first`): one all-to-all
    when they share a shape, else one each."""
    if query.shape == key.shape == value.shape and query.dtype == key.dtype == value.dtype:
        return stacked_to_heads((query, key, value), group, heads_first)
    return tuple(stacked_to_heads((t,), group, heads_first)[0] for t in (query, key, value))


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """Inverse of `to_heads` for one tensor: `[B, S, H/cp, D]` -> `[B, S/cp, H, D]`."""
    cp = group.size()
    b, s_full, h_local, d = x.shape
    s = s_full // cp
    send = dense(x.view(b, cp, s, h_local, d).transpose(0, 1))  # [cp (dest), B, s, h/cp, D]
    recv = all_to_all(send, group)  # [cp (head group), B, s, h/cp, D]
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s, cp * h_local, d)


def _native(backend) -> bool:
    """True when `dispatch_attention_fn(..., backend=backend)` would run diffusers' native backend (torch SDPA on
    permuted views) without its argument checks: `backend`, or diffusers' active one when None, is "native"."""
    name = _AttentionBackendRegistry._active_backend if backend is None else backend
    return name == "native" and not _AttentionBackendRegistry._checks_enabled


def native_whole(backend, args: dict) -> bool:
    """`whole_attention` would call torch's SDPA itself (diffusers' native backend, no extra `attention_kwargs`)."""
    return _native(backend) and not args.get("attention_kwargs")


def sdpa_heads(scale):
    """`attend` for `ulysses_attention(..., heads_first=True)` where `native_whole`: torch's SDPA on the received
    `[B, H/cp, S, D]` views as they are (`whole_attention`'s, less its three transposes in and one out)."""

    def sdpa(q, k, v, attn_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)

    return sdpa


def whole_attention(original, backend, scale, args: dict):
    """`attend(q, k, v, attn_mask)` for `ulysses_attention` on whole sequences (`[B, S, H/cp, D]`): diffusers'
    dispatcher `original` with `backend`; or, when that would run diffusers' native backend with no extra
    `attention_kwargs`, torch's SDPA itself on the same `[B, H, S, D]` views with the same arguments (the call
    `_native_attention` makes), skipping the dispatcher's Python (its registry lookup, kwargs dicts and filter),
    which a CP attention would otherwise pay on top of its own."""
    if native_whole(backend, args):

        def sdpa(q, k, v, attn_mask):
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale).transpose(1, 2)

        return sdpa

    def attend(q, k, v, attn_mask):
        return original(q, k, v, attn_mask=attn_mask, scale=scale, backend=backend)

    return attend


def ulysses_attention(query, key, value, mask, *, group, attend, full_mask=None, heads_first=False) -> torch.Tensor:
    """Attention over the whole `cp`-split sequence; `attend(q, k, v, attn_mask)` runs on full sequences,
    `[B, S, H/cp, D]` in and out, or `[B, H/cp, S, D]` with `heads_first` (`sdpa_heads`).

    mask: this rank's `[B, S/cp]` key mask or None, gathered here; or `full_mask`, every rank's already
    gathered (`[B, S]`). It is passed to `attend` as `[B, 1, 1, S]`.
    """
    q, k, v = to_heads(query, key, value, group, heads_first)
    full = gather_key_mask(mask, group) if full_mask is None else full_mask
    out = attend(q, k, v, None if full is None else full.unsqueeze(1).unsqueeze(1))
    return heads_to_seq(out.transpose(1, 2) if heads_first else out, group)
