"""Embeddings cut to the rank's tokens as they run: a per-frame module's output cut to the rank's tokens of each
sample (`dtp/runtime/cp/framewise.py`, Allegro), and a joint [text | video] embedding cut to [whole text | the rank's
video chunk] (`dtp/runtime/cp/joint_embed.py`, ConsisID).

Compared with an independent construction: diffusers' `PatchEmbed` on the whole [B x F, C, H, W] frames, made
frame-major per sample as Allegro's forward does (`unflatten(0, (B, -1)).flatten(1, 2)`), then cut with
`chunk(cp)[rank]`. Token ranges that cross a frame boundary (3 frames of 4 patches at cp = 2, 3, 4, 6) are the
case a per-frame cut would get wrong. The joint embedding against diffusers' `CogVideoXPatchEmbed` output whose video
rows are zero-padded to a multiple of cp and cut, the text rows whole. The gloo parity of the plans is
tests/distributed/test_cp_video.py (Allegro) and tests/distributed/test_cp_video_b.py (ConsisID).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers.models.embeddings import CogVideoXPatchEmbed, PatchEmbed
from hypothesis import given, settings
from hypothesis import strategies as st

from dtp.analysis.whole import Made, padded, whole_at_peak
from dtp.errors import ForwardError, PlanError
from dtp.plan.cp import PadRule, SplitRule, cp_plan_from_mapping
from dtp.runtime.cp.framewise import frames_chunk, patch_embed_frames
from dtp.runtime.cp.hooks import PadState
from dtp.runtime.cp.joint_embed import cogvideox_patch_embed

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


JOINT = SplitRule("patch_embed", 0, 1, 3, True, pad=PadRule("last", ("a",)), skip="text_embeds")
COGVIDEOX = dict(patch_size=2, in_channels=3, embed_dim=32, text_embed_dim=6, sample_width=6, sample_height=4)


@settings(max_examples=12, deadline=None)
@given(
    cp=st.sampled_from([2, 3, 4, 8]),
    batch=st.integers(1, 2),
    kwargs=st.sampled_from(
        [
            dict(use_positional_embeddings=False, use_learned_positional_embeddings=False),  # ConsisID: RoPE
            dict(
                use_positional_embeddings=False, use_learned_positional_embeddings=False, patch_size_t=2
            ),  # 1.5's linear patching
            dict(max_text_seq_length=5, sample_frames=5, temporal_compression_ratio=2),  # CogVideoX 2B: sincos table
        ]
    ),
)
def test_joint_embedding_is_the_whole_text_and_the_ranks_padded_video_chunk(cp, batch, kwargs):
    """3 (or 4 with a temporal patch) frames of 2 x 3 patches: [text (5 rows) whole | video chunk r of the video
    zero-padded to a multiple of cp] within 1e-6 x max |ref| (the projection runs on fewer frames); the pad slot and
    the split's lengths recorded as an input split records them."""
    module = _perturbed(CogVideoXPatchEmbed(**{**COGVIDEOX, **kwargs}))
    frames = 4 if kwargs.get("patch_size_t") else 3
    text, video = torch.randn(batch, 5, 6), torch.randn(batch, frames, 3, 4, 6)
    with torch.no_grad():
        whole = module(text, video)
        total = whole.shape[1] - 5
        padded = torch.cat([whole[:, 5:], whole.new_zeros(batch, (-total) % cp, 32)], dim=1)
        for rank in range(cp):
            pads = PadState()
            where = dict(rule=JOINT, pads=pads, path="p", rank=rank, cp=cp, what="p")
            out = cogvideox_patch_embed(module, text, video, **where)
            expected = torch.cat([whole[:, :5], padded.chunk(cp, dim=1)[rank]], dim=1)
            assert out.shape == expected.shape, (cp, rank)
            assert (out - expected).abs().max() <= 1e-6 * expected.abs().max(), (cp, rank)
            local, slot = padded.shape[1] // cp, pads.slots["last"]
            assert pads.lengths["p.0"] == (local, total)
            assert (slot.local, slot.valid, slot.total) == (local, max(0, min(local, total - rank * local)), total)
            assert slot.padded == (local * cp != total)


@pytest.mark.parametrize(
    "rule",
    [
        {"dim": 1, "skip": "text_embeds"},  # an input split
        {"dim": 1, "output": True, "flatten": True, "skip": "text_embeds"},
        {"dim": 1, "output": True, "frames_of": "hidden_states", "skip": "text_embeds"},
    ],
)
def test_skip_is_an_output_zero_rule(rule):
    key = 0 if rule.get("output") else "x"
    with pytest.raises(PlanError, match="skip"):
        cp_plan_from_mapping({"split": {"patch_embed": {key: rule}}}, "t")


def test_check_counts_a_whole_sequence_padded_for_the_cut_as_whole():
    """`dtp check`'s whole-tensor report: a tensor one rank never makes, the whole video zero-padded to a multiple of
    cp ([1, 17552, 3072] of 17550 tokens at cp = 8: ConsisID's 0.108 GB that the report missed), is held whole; a
    rank's own chunk ([1, 2194, 3072]) and a count that is not a padded length ([1, 6, 8] of [1, 1, 8]) are not."""
    made = frozenset({((1, 17550, 3072), "bfloat16"), ((1, 1, 8), "bfloat16")})
    one = SimpleNamespace(made=made, at_peak=())
    at_peak = tuple(
        Made(n, shape, "bfloat16", "cat", "")
        for n, shape in ((107_839_488, (1, 17552, 3072)), (13_479_936, (1, 2194, 3072)), (96, (1, 6, 8)))
    )
    report = whole_at_peak(SimpleNamespace(at_peak=at_peak), one, cp=8, tp=1, per_rank=1, ideal=1.0)
    assert [row["tensor"] for row in report["tensors"]] == ["[1, 17552, 3072] bfloat16"]
    assert not padded(((1, 6, 8), "bfloat16"), made, 8) and not padded(((1, 17560, 3072), "bfloat16"), made, 8)
