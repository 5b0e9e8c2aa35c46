"""Ring attention's block math and log-sum-exp merge, and the sequence chunking, without processes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dtp
import dtp.runtime.cp.kernels as kernels_module
from dtp.runtime.cp.masks import key_mask
from dtp.runtime.cp.ring import block_attention, merge
from dtp.runtime.cp.sequence import flat_chunk, local_chunk


def _sdpa(q, k, v, mask):
    """The reference: torch SDPA in [B, S, H, D] layout, mask [B, S_k] (bool or additive)."""
    m = None if mask is None else mask[:, None, None, :]
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=m
    ).transpose(1, 2)


@pytest.fixture(params=["fused_cpu", "portable"])
def block_path(request, monkeypatch):
    """Run a test through the CPU flash kernel and through the portable fp32 math."""
    monkeypatch.setattr(kernels_module, "CPU_FLASH", request.param == "fused_cpu")
    return request.param


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    blocks=st.integers(1, 4),
    block_len=st.integers(1, 5),
    q_len=st.integers(1, 6),
    heads=st.integers(1, 3),
    masked=st.sampled_from([None, "bool", "float"]),
    seed=st.integers(0, 2**16),
)
def test_blockwise_merge_equals_full_attention(block_path, blocks, block_len, q_len, heads, masked, seed):
    """Attention over cp key blocks merged by log-sum-exp == SDPA over all keys (<= 1e-5 rel), any block order."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, q_len, heads, 8, generator=g)
    k = torch.randn(2, blocks * block_len, heads, 8, generator=g)
    v = torch.randn(2, blocks * block_len, heads, 8, generator=g)
    mask = None
    if masked is not None:
        mask = torch.rand(2, blocks * block_len, generator=g) > 0.4
        mask[:, 0] = True  # every query sees at least one key, as in every model here
        if masked == "float":
            mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    ref = _sdpa(q, k, v, mask)
    order = torch.randperm(blocks, generator=g).tolist()
    out = lse = None
    for j in order:
        keys = slice(j * block_len, (j + 1) * block_len)
        part = block_attention(q, k[:, keys], v[:, keys], None if mask is None else mask[:, keys], 8**-0.5)
        out, lse = part if out is None else merge(out, lse, *part)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max() <= 1e-5 * max(ref.abs().max(), 1.0)


def test_query_chunking_matches_one_block(monkeypatch):
    """Portable path: scores in query-row chunks (tiny MAX_SCORES) give the same out and lse as one block."""
    monkeypatch.setattr(kernels_module, "CPU_FLASH", False)
    q, k, v = torch.randn(2, 9, 2, 4), torch.randn(2, 5, 2, 4), torch.randn(2, 5, 2, 4)
    mask = torch.rand(2, 5) > 0.3
    whole = block_attention(q, k, v, mask, 0.5)
    monkeypatch.setattr(kernels_module, "MAX_SCORES", 2 * 2 * 5 * 2)  # 2 query rows at a time
    chunked = block_attention(q, k, v, mask, 0.5)
    torch.testing.assert_close(chunked[0], whole[0])
    torch.testing.assert_close(chunked[1], whole[1])


def test_fully_masked_block_carries_zero_weight(block_path):
    q, k, v = torch.randn(1, 3, 2, 4), torch.randn(1, 4, 2, 4), torch.randn(1, 4, 2, 4)
    visible = block_attention(q, k, v, None, 0.5)
    hidden = block_attention(q, k * 7, v * 7, torch.zeros(1, 4, dtype=torch.bool), 0.5)
    assert torch.isneginf(hidden[1]).all() and (hidden[0] == 0).all()
    out, lse = merge(*visible, *hidden)
    torch.testing.assert_close(out, visible[0])
    torch.testing.assert_close(lse, visible[1])


@given(n_chunks=st.integers(1, 6), chunk=st.integers(1, 5), dim=st.integers(0, 2))
def test_local_chunks_concatenate_back_in_rank_order(n_chunks, chunk, dim):
    shape = [2, 3, 4]
    shape[dim] = n_chunks * chunk
    x = torch.arange(torch.Size(shape).numel()).reshape(shape)
    parts = [local_chunk(x, dim, r, n_chunks, "x") for r in range(n_chunks)]
    assert torch.equal(torch.cat(parts, dim=dim), x)


@given(cp=st.sampled_from([2, 3, 4, 6]), frames=st.integers(1, 4), rows=st.integers(1, 3))
def test_flat_chunks_are_the_ranks_tokens_of_the_flattened_grid(cp, frames, rows):
    """A patch embedding's [B, C, F, H, W] output cut by `flat_chunk`: each rank's piece, flattened as the model
    flattens it (dims 2..), is its `local_chunk` of the whole token sequence, and owns its storage (a copy)."""
    width = cp * 2  # F * H * W divisible by cp
    x = torch.arange(2 * 3 * frames * rows * width).reshape(2, 3, frames, rows, width).float()
    tokens = x.flatten(2).transpose(1, 2)  # what the model builds from the whole output: [B, S, C]
    for rank in range(cp):
        piece = flat_chunk(x, 2, rank, cp, "output 0 of 'patch_embedding'", expected_dims=5)
        assert piece.ndim == 5 and piece.shape[2:4] == (1, 1)
        assert torch.equal(piece.flatten(2).transpose(1, 2), local_chunk(tokens, 1, rank, cp, "tokens"))
        assert piece.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_flatten_needs_an_output_split():
    from dtp.plan.cp import cp_plan_from_mapping

    with pytest.raises(dtp.PlanError, match="`flatten`.*needs `output: true`"):
        cp_plan_from_mapping({"split": {"patch_embedding": {"hidden_states": {"dim": 2, "flatten": True}}}}, "p")


def test_indivisible_length_names_length_and_degree():
    with pytest.raises(dtp.ForwardError, match="sequence length 10 .* not divisible by the cp degree 4"):
        local_chunk(torch.zeros(1, 10, 3), 1, 0, 4, "input 'hidden_states'")
    with pytest.raises(dtp.ForwardError, match="expected a 3-D tensor"):
        local_chunk(torch.zeros(10, 3), 0, 0, 2, "x", expected_dims=3)


def test_key_mask_accepts_per_key_shapes_only():
    assert key_mask(torch.ones(2, 1, 1, 5, dtype=torch.bool), 2, 5).shape == (2, 5)
    assert key_mask(torch.ones(1, 5), 2, 5).shape == (2, 5)
    assert key_mask(None, 2, 5) is None
    with pytest.raises(dtp.ForwardError, match="per-key masks"):
        key_mask(torch.ones(2, 1, 3, 5, dtype=torch.bool), 2, 5)


@pytest.mark.parametrize("masked", [False, True])
def test_heads_first_merge_of_the_last_step_equals_sdpa_and_swapped_weights_fail(masked):
    """Two key blocks merged as `ring_attention` merges them (`[B, H, S, D]`, no running LSE on the last step, no
    nan guard without a mask) == SDPA over both blocks (<= 1e-5 rel). Negative control: the two blocks' weights
    swapped (each output weighted by the other block's LSE) misses by far."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 5, 3, 8, generator=g),
        torch.randn(2, 8, 3, 8, generator=g),
        torch.randn(2, 8, 3, 8, generator=g),
    )
    mask = (torch.rand(2, 8, generator=g) > 0.4) | (torch.arange(8) == 0) if masked else None
    parts = [
        block_attention(q, k[:, j : j + 4], v[:, j : j + 4], None if mask is None else mask[:, j : j + 4], 8**-0.5)
        for j in (0, 4)
    ]
    (o_a, lse_a), (o_b, lse_b) = ((o.transpose(1, 2), lse) for o, lse in parts)
    out, lse = merge(o_a, lse_a, o_b, lse_b, heads_first=True, masked=masked, need_lse=False)
    ref = _sdpa(q, k, v, mask)
    assert lse is None
    assert (out.transpose(1, 2) - ref).abs().max() <= 1e-5 * ref.abs().max()
    swapped, _ = merge(o_a, lse_b, o_b, lse_a, heads_first=True, masked=masked, need_lse=False)
    assert (swapped.transpose(1, 2) - ref).abs().max() > 1e-2 * ref.abs().max()
