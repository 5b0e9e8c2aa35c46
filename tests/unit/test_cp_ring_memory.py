"""What ring attention holds at its peak, traced on fake CUDA bf16 tensors (the fused flash path) over a fake process
group of 4: the peak is counted in K-chunk units (one rank's `[B, S/cp, H, D]` bf16 key). The minimum of an
overlapped ring is the K/V chunk computed + the one received (4 units); above it: the running fp32 sum (2), and the
first merge's two bf16 block outputs (2; later merges add into the sum in place, `merge`'s into). Negative controls:
merges that allocate a new sum each step (`into` off), and the sent chunk kept until the next send
(the tuple of `send_to_next` not dropped at its wait)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

import dtp.runtime.cp.ring as ring_module
from dtp.analysis.fakepg import fake_world
from dtp.analysis.trace import fake_mode, trace_call

CP = 4


class _Ring(nn.Module):
    def forward(self, q, k, v):
        return ring_module.ring_attention(q, k, v, None, group=dist.group.WORLD)


def _peak_in_chunks() -> float:
    with fake_world(CP):
        with fake_mode():
            q, k, v = (torch.empty(1, 256, 8, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        trace = trace_call(_Ring(), lambda m, **kw: m(**kw), dict(q=q, k=k, v=v), device="cuda")
    return trace.peak_bytes / k.nbytes


def test_the_ring_peak_is_two_kv_chunks_and_one_fp32_sum():
    """Measured 8.16 (before this round's change: 11.1): 4 (2 K/V chunks) + 2 (fp32 sum) + 2 (the first merge's
    bf16 blocks) + LSEs."""
    assert _peak_in_chunks() <= 8.2


def test_negative_control_a_new_sum_every_merge(monkeypatch):
    """Every merge out of place (`into` off: a new fp32 sum beside the old one): above the bound."""
    merge = ring_module.merge
    monkeypatch.setattr(ring_module, "merge", lambda *args, **kwargs: merge(*args, **{**kwargs, "into": False}))
    assert _peak_in_chunks() > 8.2


def test_negative_control_the_sent_chunk_kept_to_the_next_send(monkeypatch):
    """`wait_for`'s tuple kept alive (the sent chunk with it) until the next step's send: above the bound."""
    kept, wait_for = [], ring_module.wait_for

    def keeping(started):
        kept[:] = [started]
        return wait_for(started)

    monkeypatch.setattr(ring_module, "wait_for", keeping)
    assert _peak_in_chunks() > 8.2


def test_a_merge_into_the_sum_equals_a_new_sum_and_writes_in_place():
    """`merge(into=True)` on an fp32 sum: the values of the out-of-place merge (bf16 and fp32 blocks, both layouts,
    a row neither block sees), written into the sum itself. Control: the out-of-place merge leaves the sum as it was."""
    g = torch.Generator().manual_seed(0)
    for heads_first in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            shape = (2, 3, 5, 8) if heads_first else (2, 5, 3, 8)
            acc, block = torch.randn(shape, generator=g), torch.randn(shape, generator=g).to(dtype)
            lse_a, lse_b = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
            lse_a[0, 0, 0] = lse_b[0, 0, 0] = float("-inf")  # a row neither block sees
            kept = acc.clone()
            new, new_lse = ring_module.merge(acc, lse_a, block, lse_b, heads_first=heads_first)
            assert torch.equal(acc, kept)  # control: out of place
            out, lse = ring_module.merge(acc, lse_a, block, lse_b, heads_first=heads_first, into=True)
            assert out.data_ptr() == acc.data_ptr() and torch.equal(lse, new_lse)
            assert (out - new).abs().max() <= 1e-6 * new.abs().max()
