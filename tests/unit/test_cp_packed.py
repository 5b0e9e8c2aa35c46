"""Cosmos 3 Omni's packed attention under CP (`runtime/cp/packed.py`): the pieces that need no process group. The
gloo parity and its negative controls are in tests/distributed/test_cp_video.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dtp
from dtp.resolve import resolve, resolve_cp
from dtp.runtime.cp.packed import causal_block, repeat_kv
from dtp.testing.tiny import PLAN_CLASSES, tiny_model


def test_usp_is_refused_before_anything_changes():
    """Ulysses x ring (USP) is a PlanError naming the packed attention; plain Ulysses and ring pass the check."""
    model = tiny_model(PLAN_CLASSES["cosmos3_omni"])
    resolved = resolve_cp(resolve(dtp.load_plan("cosmos3_omni"), model), model)
    with pytest.raises(dtp.PlanError, match="Cosmos 3's packed attention"):
        resolved.check(1, 4, "ulysses", ulysses=2)
    resolved.check(1, 4, "ulysses")
    resolved.check(1, 4, "ring")


def test_causal_block_and_repeated_kv_heads_match_sdpa():
    """The ring's diagonal block (fp32 math with its log-sum-exp) equals causal SDPA with GQA, its kv heads repeated
    in contiguous groups (query head i keeps kv head i // 4), and given the 2 kv heads unexpanded it gives the same."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 6, 8, 16, generator=g), torch.randn(1, 6, 2, 16, generator=g), torch.randn(1, 6, 2, 16)
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, enable_gqa=True)
    out, lse = causal_block(q, repeat_kv(k, 4), repeat_kv(v, 4), 16**-0.5)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)
    assert lse.shape == (1, 8, 6) and torch.isfinite(lse).all()
    grouped, grouped_lse = causal_block(q, k, v, 16**-0.5)  # the kv heads as they are: groups folded into the einsum
    torch.testing.assert_close(grouped, out, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grouped_lse, lse, rtol=1e-6, atol=1e-7)
