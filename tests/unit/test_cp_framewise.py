"""A per-frame module's output cut to the rank's tokens of each sample (`dtp/runtime/cp/framewise.py`, Allegro).

Compared with an independent construction: diffusers' `PatchEmbed` on the whole [B x F, C, H, W] frames, made
frame-major per sample as Allegro's forward does (`unflatten(0, (B, -1)).flatten(1, 2)`), then cut with
`chunk(cp)[rank]`. Token ranges that cross a frame boundary (3 frames of 4 patches at cp = 2, 3, 4, 6) are the
case a per-frame cut would get wrong. The gloo parity of Allegro's plan is tests/distributed/test_cp_video.py.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.embeddings import PatchEmbed
from hypothesis import given, settings
from hypothesis import strategies as st

from dtp.errors import ForwardError, PlanError
from dtp.plan.cp import cp_plan_from_mapping
from dtp.runtime.cp.framewise import frames_chunk, patch_embed_frames

FRAMES, BATCH = 3, 2


def _perturbed(module):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


def _whole_tokens(module, latent, batch):
    """Allegro's embedding of [B x F, C, H, W] frames: [B, F x P, D], frame-major per sample."""
    return module(latent).unflatten(0, (batch, -1)).flatten(1, 2)


@settings(max_examples=12, deadline=None)
@given(
    cp=st.sampled_from([1, 2, 3, 4, 6]),
    batch=st.integers(1, BATCH),
    kwargs=st.sampled_from([dict(pos_embed_type=None), dict(layer_norm=True), dict(height=4, width=4)]),
)
def test_patch_embed_frames_per_rank_is_diffusers_cut(cp, batch, kwargs):
    """Each rank's [B, S / cp, D] is the whole frame-major embedding's chunk `rank` (Allegro's `pos_embed_type=None`,
    a layer norm, the sincos table at its own size), within 1e-6 x max |ref|: the projection runs on fewer frames,
    and CPU convolutions round differently with the batch size (9.5e-7 seen at one sample, 0 at two)."""
    module = _perturbed(PatchEmbed(**{**dict(height=4, width=4, patch_size=2, in_channels=3, embed_dim=8), **kwargs}))
    latent = torch.randn(batch * FRAMES, 3, 4, 4)  # 3 frames of 2 x 2 patches: 12 tokens a sample
    with torch.no_grad():
        expected = _whole_tokens(module, latent, batch).chunk(cp, dim=1)
        for rank in range(cp):
            out = patch_embed_frames(module, latent, batch=batch, rank=rank, cp=cp, what="pos_embed")
            # Allegro's own reshape of the module's output leaves the rank's tokens as they are
            out = out.unflatten(0, (batch, -1)).flatten(1, 2)
            assert out.shape == expected[rank].shape, (cp, rank)
            assert (out - expected[rank]).abs().max() <= 1e-6 * expected[rank].abs().max(), (cp, rank)


def test_frames_chunk_is_each_samples_chunk_and_a_per_frame_cut_is_not():
    """The generic cut: rank r's rows of each sample's frame-major tokens; cutting each frame's patches instead (what a
    plain dim-1 split of [B x F, P, D] would do) gives other tokens (negative control)."""
    x = torch.arange(BATCH * FRAMES * 4.0).reshape(BATCH * FRAMES, 4, 1)
    for rank in range(2):
        chunk = frames_chunk(x, BATCH, rank, 2, "x")
        assert torch.equal(chunk, x.reshape(BATCH, FRAMES * 4, 1)[:, rank * 6 : (rank + 1) * 6])
        per_frame = x.chunk(2, dim=1)[rank].reshape(BATCH, -1, 1)
        assert not torch.equal(chunk, per_frame)


def test_rows_that_are_not_frames_of_the_batch_and_counts_cp_does_not_divide_are_refused():
    module = PatchEmbed(height=4, width=4, patch_size=2, in_channels=3, embed_dim=8, pos_embed_type=None)
    with pytest.raises(ForwardError, match="5 rows are not the frames of 2 samples"):
        frames_chunk(torch.zeros(5, 4, 1), 2, 0, 2, "x")
    with pytest.raises(ForwardError, match="12.*cp degree 5"):
        patch_embed_frames(module, torch.zeros(3, 3, 4, 4), batch=1, rank=0, cp=5, what="pos_embed")


@pytest.mark.parametrize(
    "rule",
    [
        {"dim": 1, "frames_of": "hidden_states"},  # an input split
        {"dim": 2, "output": True, "frames_of": "hidden_states"},  # not dim 1
        {"dim": 1, "output": True, "flatten": True, "frames_of": "hidden_states"},
        {"dim": 1, "output": True, "frames_of": 3},
    ],
)
def test_frames_of_is_an_output_zero_dim_one_rule(rule):
    key = 0 if rule.get("output") else "x"
    with pytest.raises(PlanError, match="frames_of"):
        cp_plan_from_mapping({"split": {"pos_embed": {key: rule}}}, "t")
