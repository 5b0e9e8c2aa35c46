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
"""

from __future__ import annotations

import torch

from ...errors import ForwardError
from ...styles.collectives import send_to_next, wait_for
from .kernels import block_kernel, reference_block
from .masks import gather_key_mask


def block_attention(q, k, v, mask, scale: float, backend: str | None = None, kernel=None):
    """Attention of `q` over one key block: `(out [B, Sq, H, Dv], lse [B, H, Sq] fp32)`, in `kernel` or else the
    one `kernels.block_kernel` chooses for these tensors. mask: `[B, Sk]` bool (True = attend) or additive float,
    or None. Rows with no visible key give out = 0 and lse = -inf, so that they carry zero weight in `merge`."""
    if kernel is None:
        kernel = block_kernel(q.device.type, q.dtype, mask is not None, backend, (q.shape[-1], v.shape[-1]))
    return kernel(q, k, v, mask, scale)


def merge(out_a, lse_a, out_b, lse_b):
    """Combine two partial results over disjoint key sets (fp32); see the module docstring. Written as one `lerp`:
    exp(lse_a - lse) o_a + exp(lse_b - lse) o_b = o_a + w (o_b - o_a) with w = sigmoid(lse_b - lse_a) (torch's and
    diffusers' ring merge), 7 ops a merge against 10 before (host time being what a step costs). A row neither block
    sees (lse = -inf in both) gives -inf - -inf = nan, taken as w = 1/2 of two zero rows (0), and lse =
    logaddexp(-inf, -inf) = -inf. Outputs of another dtype than the LSE's (bf16 blocks on CUDA) are promoted inside
    the multiplies instead, never copied."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_b = torch.sigmoid((lse_b - lse_a).nan_to_num(nan=0.0)).transpose(1, 2).unsqueeze(-1)  # [B, Sq, H, 1]
    if out_a.dtype == out_b.dtype == w_b.dtype:
        return torch.lerp(out_a, out_b, w_b), lse
    return torch.addcmul(out_a * (1 - w_b), out_b, w_b), lse


def ring_attention(
    query, key, value, mask, *, group, scale: float | None = None, backend: str | None = None, full_mask=None
) -> torch.Tensor:
    """Attention of the local queries over every rank's keys; shapes `[B, S/cp, H, D]` in and out.

    mask: this rank's `[B, S/cp]` key mask (gathered here), or `full_mask`: every rank's, already gathered
    (`[B, S]`, e.g. from a per-forward cache). backend: a ring kernel family (`policy.ring_kernel_family`).
    """
    if key.shape[2] != query.shape[2]:
        raise ForwardError(
            f"ring attention needs as many k/v heads as q heads, got q {query.shape[2]}, k {key.shape[2]}."
        )
    cp, rank = group.size(), group.rank()
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    masks = gather_key_mask(mask, group) if full_mask is None else full_mask
    masks = None if masks is None else masks.chunk(cp, dim=1)
    d_k, d_v = key.shape[-1], value.shape[-1]
    kernel = block_kernel(query.device.type, query.dtype, masks is not None, backend, (d_k, d_v))
    kv = torch.cat([key, value], dim=-1)  # one message per step: [B, S/cp, H, Dk + Dv], contiguous
    k, v = key, value  # step 0: this rank's own block
    out = lse = None
    for step in range(cp):
        incoming = send_to_next(kv, group) if step < cp - 1 else None  # issued first
        source = (rank - step) % cp
        if step:
            k, v = kv.narrow(-1, 0, d_k), kv.narrow(-1, d_k, d_v)
        block = block_attention(query, k, v, None if masks is None else masks[source], scale, kernel=kernel)
        out, lse = block if out is None else merge(out, lse, *block)
        if incoming is not None:
            kv = wait_for(incoming)  # after this block's compute
    return out if out.dtype == query.dtype else out.to(query.dtype)


__all__ = ["block_attention", "merge", "reference_block", "ring_attention"]
