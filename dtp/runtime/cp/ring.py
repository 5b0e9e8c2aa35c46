"""Ring attention: K/V chunks travel around the `cp` ring; partial results merge by log-sum-exp in fp32.

Rank r keeps its queries `q_r` (`[B, S/cp, H, D]`) and at step t holds the K/V chunk of rank
`(r - t) mod cp`, while sending the chunk it holds to rank r+1 and receiving the next from r-1
(the transfer overlaps the block's compute). For one block j the partial result is

    o_j = softmax(q k_j^T * scale) v_j,   lse_j = log sum_k exp(q k_j^T * scale)

and two partials merge exactly as  lse = logaddexp(lse_a, lse_b),
o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b. Everything is accumulated in fp32 and cast back
to the query dtype at the end. A block whose keys are all masked has lse = -inf and weight 0.
On CPU a block runs in torch's fused flash kernel for CPU, which returns the log-sum-exp and keeps
memory O(S/cp); elsewhere (CUDA, other devices) it runs in portable fp32 math whose scores are
computed for at most `MAX_SCORES` elements at a time (query rows in chunks).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import ForwardError
from .masks import gather_key_mask

MAX_SCORES = 1 << 24  # fp32 score elements computed at once (64 MiB); rows of queries are chunked to fit
USE_FUSED_CPU = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def block_attention(q, k, v, mask, scale: float):
    """fp32 attention of `q` over one key block: `(out [B, Sq, H, Dv], lse [B, H, Sq])`.

    mask: `[B, Sk]` bool (True = attend) or additive float, or None. Rows with no visible key give
    out = 0 and lse = -inf, so that they carry zero weight in `merge`.
    """
    if USE_FUSED_CPU and q.device.type == "cpu":
        return _block_fused_cpu(q, k, v, mask, scale)
    b, s_q, h, _ = q.shape
    rows = max(1, MAX_SCORES // max(1, b * h * k.shape[1]))
    if s_q <= rows:
        return _block(q, k, v, mask, scale)
    parts = [_block(q_rows, k, v, mask, scale) for q_rows in q.split(rows, dim=1)]
    return torch.cat([o for o, _ in parts], dim=1), torch.cat([lse for _, lse in parts], dim=2)


def _block(q, k, v, mask, scale: float):
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if mask is not None:
        mask = mask[:, None, None, :]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    probs = torch.exp(scores - row_max)
    denom = probs.sum(dim=-1, keepdim=True)
    lse = (row_max + denom.log()).squeeze(-1)
    out = torch.matmul(probs, vf) / denom.clamp_min(torch.finfo(torch.float32).tiny)
    return out.transpose(1, 2), lse


def _block_fused_cpu(q, k, v, mask, scale: float):
    """The same result through torch's CPU flash kernel (fp32 inputs, returns out and lse)."""
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    bias = None
    if mask is not None:
        bias = (
            mask.float()
            if mask.dtype != torch.bool
            else torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        )
        bias = bias[:, None, None, :]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qf, kf, vf, 0.0, False, attn_mask=bias, scale=scale
    )
    if bias is not None:
        # The kernel reports lse = 0 (not -inf) for a row with no visible key: give such rows zero weight.
        visible = torch.isfinite(bias).any(dim=-1, keepdim=True)  # [B, 1, 1, 1]
        lse = lse.masked_fill(~visible[..., 0], float("-inf"))
        out = out.masked_fill(~visible, 0.0)
    return out.transpose(1, 2), lse


def merge(out_a, lse_a, out_b, lse_b):
    """Combine two partial results over disjoint key sets (fp32); see the module docstring."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w_a = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)  # [B, Sq, H, 1]
    w_b = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    return out_a * w_a + out_b * w_b, lse


def ring_attention(query, key, value, mask, *, group, scale: float | None = None) -> torch.Tensor:
    """Attention of the local queries over every rank's keys; shapes `[B, S/cp, H, D]` in and out."""
    if key.shape[2] != query.shape[2]:
        raise ForwardError(
            f"ring attention needs as many k/v heads as q heads, got q {query.shape[2]}, k {key.shape[2]}."
        )
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    masks = gather_key_mask(mask, group)
    masks = None if masks is None else masks.chunk(cp, dim=1)
    send_to = dist.get_global_rank(group, (rank + 1) % cp)
    recv_from = dist.get_global_rank(group, (rank - 1) % cp)
    d_k = key.shape[-1]
    kv = torch.cat([key, value], dim=-1).contiguous()  # one message per step
    out = lse = None
    for step in range(cp):
        pending, incoming = [], None
        if step < cp - 1:
            incoming = torch.empty_like(kv)
            # One batch: NCCL runs the pair inside one group call, so cp=2 (send and receive with the same
            # peer) cannot deadlock; gloo runs them as two asynchronous ops.
            pending = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, kv, send_to, group=group),
                    dist.P2POp(dist.irecv, incoming, recv_from, group=group),
                ]
            )
        source = (rank - step) % cp
        block = block_attention(query, kv[..., :d_k], kv[..., d_k:], None if masks is None else masks[source], scale)
        out, lse = block if out is None else merge(out, lse, *block)
        for work in pending:
            work.wait()
        kv = incoming if incoming is not None else kv
    return out.to(query.dtype)
