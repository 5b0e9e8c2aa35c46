"""Ring attention: K/V chunks travel around the `cp` ring; partial results merge by log-sum-exp in fp32.

Rank r keeps its queries `q_r` (`[B, S/cp, H, D]`) and at step t holds the K/V chunk of rank
`(r - t) mod cp`, while sending the chunk it holds to rank r+1 and receiving the next from r-1.
For one block j the partial result is

    o_j = softmax(q k_j^T * scale) v_j,   lse_j = log sum_k exp(q k_j^T * scale)

and two partials merge exactly as  lse = logaddexp(lse_a, lse_b),
o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b. The merge runs in fp32 (a bf16 block output is promoted inside
the multiply, never copied), and the sum is cast back to the query dtype at the end. A block whose keys are all
masked has lse = -inf and weight 0.

Each block runs in the fused kernel `kernels.block_kernel` chooses once per call (flash / efficient / cuDNN on
CUDA, torch's CPU flash kernel on CPU, portable fp32 math elsewhere). The K/V rotation
(`styles.collectives.send_to_next`, an all-to-all with one non-empty split each way) is issued before the block's
compute and waited for when the next step first reads it, so transfer and compute overlap: in eager the
ProcessGroup's own async call (~10 µs of host; the functional `permute_tensor` cost ~290 µs), under
`torch.compile(fullgraph=True)` the functional `permute_tensor`, which dynamo traces (P2P `batch_isend_irecv` broke
the graph).

Memory: at a step the ring holds the K/V chunk computed and the one received, the running fp32 sum (added into in
place from step 2 on, `merge`'s into) and the block's output; the sent chunk is dropped at its wait and each block
once merged (`tests/unit/test_cp_ring_memory.py`: 8.16 K-chunk units at the peak on fake CUDA, the first merge's).

Grouped-query heads (`enable_gqa=True`, Cosmos 3): K/V travel with their own Hkv heads, H / Hkv times smaller than
expanded ones, and each step expands only the block it computes (`expand_kv_heads`; the fused ops take as many k/v
heads as q heads), so the rank's K/V and the chunk in flight never hold the repeated heads.
"""

from __future__ import annotations

import torch

from ...errors import ForwardError
from ...styles.collectives import send_to_next, wait_for
from .kernels import block_kernel, reference_block
from .masks import gather_key_mask


def block_attention(
    q, k, v, mask, scale: float, backend: str | None = None, kernel=None, heads_first: bool = False, kv_groups: int = 1
):
    """Attention of `q` over one key block: `(out [B, Sq, H, Dv], lse [B, H, Sq] fp32)`, in `kernel` or else the
    one `kernels.block_kernel` chooses for these tensors. mask: `[B, Sk]` bool (True = attend) or additive float,
    or None. Rows with no visible key give out = 0 and lse = -inf, so that they carry zero weight in `merge`.
    heads_first: q, k, v and out are `[B, H, S, D]` (the kernels' own layout, `kernels.BlockKernel.run`).
    kv_groups: query heads per k/v head (grouped-query attention, `expand_kv_heads`): k and v arrive with H / kv_groups
    heads and are expanded for this block only, since the kernels take as many k/v heads as query heads."""
    if kernel is None:
        kernel = block_kernel(q.device.type, q.dtype, mask is not None, backend, (q.shape[-1], v.shape[-1]))
    if kv_groups != 1:
        head_dim = 1 if heads_first else 2
        k, v = expand_kv_heads(k, kv_groups, head_dim), expand_kv_heads(v, kv_groups, head_dim)
    return kernel.run(q, k, v, mask, scale) if heads_first else kernel(q, k, v, mask, scale)


def expand_kv_heads(t: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    """k/v heads repeated up to the query heads along `dim`, each `groups` times in a row: query head i reads kv head
    i // groups (SDPA's `enable_gqa`, diffusers' and transformers' `repeat_kv`). One copy of one block."""
    if groups == 1:
        return t
    shape = list(t.shape)
    shape.insert(dim + 1, groups)
    return t.unsqueeze(dim + 1).expand(shape).flatten(dim, dim + 1)


def kv_groups_of(query_heads: int, kv_heads: int, enable_gqa: bool) -> int:
    """Query heads per k/v head: 1 without `enable_gqa` (then the head counts must match), else H / Hkv."""
    if query_heads == kv_heads or (enable_gqa and kv_heads and query_heads % kv_heads == 0):
        return query_heads // kv_heads
    need = "a divisor of the q heads (enable_gqa=True)" if enable_gqa else "as many k/v heads as q heads"
    raise ForwardError(
        f"ring attention needs {need}, got q {query_heads}, k {kv_heads}; pass enable_gqa=True for grouped-query "
        f"k/v heads, or repeat them to the query heads."
    )


def merge(
    out_a, lse_a, out_b, lse_b, *, heads_first: bool = False, masked: bool = True, need_lse: bool = True, into=False
):
    """Combine two partial results over disjoint key sets (fp32; out `[B, Sq, H, D]`, or `[B, H, Sq, D]` with
    `heads_first`, where the weight `[B, H, Sq, 1]` is a view of the LSEs; lse `[B, H, Sq]`); see the module docstring.
    One `lerp`: exp(lse_a - lse) o_a + exp(lse_b - lse) o_b = o_b + w (o_a - o_b) with w = sigmoid(lse_a - lse_b)
    (torch's and diffusers' ring merge): 3 ops, and the LSE of the sum (`logaddexp`) only when `need_lse` (another
    step follows: the last step's is never read; None otherwise). A block whose keys are all masked has lse = -inf
    and weight 0. A row neither block sees (lse = -inf in both; only when `masked`: unmasked blocks have finite LSEs)
    gives -inf - -inf = nan, taken as w = 1/2 of two zero rows (0), and lse = logaddexp(-inf, -inf) = -inf. Outputs
    of another dtype than the LSE's (bf16 blocks on CUDA) are promoted inside the multiplies instead, never copied.
    into: `out_a` is the caller's own fp32 accumulator (a previous merge's result, read by nothing else) and is
    updated in place, the same arithmetic: a ring step then allocates no output-sized tensor (two fewer fp32
    outputs alive at the ring's peak, `ring_attention`). Otherwise the sum is one new fp32 tensor, its first product
    made in place."""
    diff = lse_a - lse_b
    w_a = torch.sigmoid(diff.nan_to_num(nan=0.0) if masked else diff).unsqueeze(-1)  # [B, H, Sq, 1]
    if not heads_first:
        w_a = w_a.transpose(1, 2)  # [B, Sq, H, 1]
    if out_a.dtype == out_b.dtype == w_a.dtype:
        out = torch.lerp(out_b, out_a, w_a, out=out_a) if into else torch.lerp(out_b, out_a, w_a)
    elif into and out_a.dtype == w_a.dtype:
        out = out_a.mul_(w_a).addcmul_(out_b, 1 - w_a)  # w o_a + (1 - w) o_b, as below: the same two products
    else:
        out = (out_b * (1 - w_a)).addcmul_(out_a, w_a)
    return out, (torch.logaddexp(lse_a, lse_b) if need_lse else None)


def ring_attention(
    query,
    key,
    value,
    mask,
    *,
    group,
    scale: float | None = None,
    backend: str | None = None,
    full_mask=None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Attention of the local queries over every rank's keys; shapes `[B, S/cp, H, D]` in and out.

    mask: this rank's `[B, S/cp]` key mask (gathered here), or `full_mask`: every rank's, already gathered
    (`[B, S]`, e.g. from a per-forward cache). backend: a ring kernel family (`policy.ring_kernel_family`).
    q and the K/V buffer are viewed as `[B, H, S, D]` once (the kernels' layout, `kernels.BlockKernel.run`), so a
    step adds no transpose; K and V travel as one buffer, one message a step.
    enable_gqa: key / value may have fewer heads than the query (a divisor, query head i reading kv head i // (H /
    Hkv), as SDPA's `enable_gqa`): they travel the ring with their own heads and are expanded per step, for the
    block being computed only (`block_attention`'s kv_groups), so the rank's K/V and every chunk in flight stay
    H / Hkv times smaller than expanded ones.
    """
    groups = kv_groups_of(query.shape[2], key.shape[2], enable_gqa)
    cp, rank = group.size(), group.rank()
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    masks = gather_key_mask(mask, group) if full_mask is None else full_mask
    masks = None if masks is None else masks.chunk(cp, dim=1)
    d_k, d_v = key.shape[-1], value.shape[-1]
    kernel = block_kernel(query.device.type, query.dtype, masks is not None, backend, (d_k, d_v))
    q = query.transpose(1, 2)
    kv = torch.cat([key, value], dim=-1)  # one message per step: [B, S/cp, H, Dk + Dv], contiguous
    out = lse = None
    for step in range(cp):
        incoming = send_to_next(kv, group) if step < cp - 1 else None  # issued first
        k, v = kv.transpose(1, 2).split_with_sizes((d_k, d_v), dim=-1)  # [B, H, S/cp, D] views, one op
        block_mask = None if masks is None else masks[(rank - step) % cp]
        block = block_attention(q, k, v, block_mask, scale, kernel=kernel, heads_first=True, kv_groups=groups)
        if out is None:
            out, lse = block
        else:
            last, masked = step == cp - 1, masks is not None  # from step 2 on, `out` is a merge's own fp32 sum
            out, lse = merge(out, lse, *block, heads_first=True, masked=masked, need_lse=not last, into=step > 1)
        block = None  # in the sum now: not alive through the next step's send and compute
        if incoming is not None:
            kv, incoming = wait_for(incoming), None  # after this block's compute; the sent chunk dropped now
    out = out.transpose(1, 2)
    return out if out.dtype == query.dtype else out.to(query.dtype)


__all__ = ["block_attention", "expand_kv_heads", "kv_groups_of", "merge", "reference_block", "ring_attention"]
