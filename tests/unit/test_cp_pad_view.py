"""Two padded streams that no attention sees together (Kandinsky 6's video `first`, audio `last`): each attention
masks its own stream's pad keys only (`runtime/cp/pad_view.py`), the plan check allows one `attention` list per
slot, and the resolver tells each attention its slots. Against independent constructions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dtp
from dtp.plan.cp import cp_plan_from_mapping
from dtp.resolve import resolve, resolve_cp
from dtp.runtime.cp.hooks import PadState
from dtp.runtime.cp.pad_view import PadView
from dtp.runtime.cp.sequence import padded_chunk
from dtp.testing.tiny import PLAN_CLASSES, tiny_model


def _state(video: int, audio: int, rank: int, cp: int) -> PadState:
    """The pad state rank `rank` records for `video` tokens padded `first` and `audio` tokens padded `last`."""
    state = PadState()
    for at, n in (("first", video), ("last", audio)):
        chunk, valid = padded_chunk(torch.zeros(1, n), 1, rank, cp, at)
        slot = state.slots[at]
        slot.local, slot.valid, slot.total = chunk.shape[1], valid, n
        slot.padded = slot.local * cp != n
    return state


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(2, 4), video=st.integers(1, 13), audio=st.integers(1, 13), data=st.data())
def test_each_view_masks_its_own_streams_pad_keys(cp, video, audio, data):
    """A view's key mask over its stream's local keys is True exactly on the rank's real tokens of that stream (the
    global positions below the stream's length), whatever the other stream's padding."""
    rank = data.draw(st.integers(0, cp - 1))
    state = _state(video, audio, rank, cp)
    for at, n in (("first", video), ("last", audio)):
        view, local = PadView(state, (at,)), -(-n // cp)
        expected = torch.arange(rank * local, (rank + 1) * local) < n
        mask = view.key_valid(local, 2, "cpu")
        if n % cp == 0:
            assert not view.padded and mask is None
        else:
            assert view.padded and torch.equal(mask, expected.expand(2, local))


def test_the_whole_state_misplaces_one_streams_keys():
    """Control: the whole state over the video keys alone (9 video, 9 audio tokens, cp = 2, rank 1: 5 local keys of
    each, 4 real) reads them as [video | audio] and refuses: the view is what makes the mask fit."""
    state = _state(9, 9, 1, 2)
    with pytest.raises(dtp.ForwardError, match="cannot hold"):
        state.key_valid(5, 1, "cpu")
    assert torch.equal(PadView(state, ("first",)).key_valid(5, 1, "cpu")[0], torch.tensor([1, 1, 1, 1, 0]).bool())


def _pads(first: list[str], last: list[str]) -> dict:
    return {
        "split": {
            "blocks.0": {
                "v": {"dim": 1, "pad": {"at": "first", "attention": first}},
                "a": {"dim": 1, "pad": {"at": "last", "attention": last}},
            },
            "blocks.*": {"rope": {"dim": 0, "pad": {"at": "first", "attention": ["x.*"]}}},
        },
        "gather": {"out": {"dim": 1}},
    }


def test_plan_check_allows_one_attention_list_per_slot():
    """Each slot's rules name one list (the video's RoPE the video's); the slots may differ; two lists in one slot
    are refused."""
    cp_plan_from_mapping(_pads(["x.*"], ["y.*"]), "p")
    with pytest.raises(dtp.PlanError, match="one slot"):
        cp_plan_from_mapping(_pads(["z.*"], ["y.*"]), "p")


def test_kandinsky6_attentions_get_their_streams_slots():
    """The bundled plan: video self-attention and av (video keys) the `first` slot, audio self-attention and va (audio
    keys) the `last`; every one of them a padded CP attention."""
    model = tiny_model(PLAN_CLASSES["kandinsky6"])
    resolved = resolve_cp(resolve(dtp.load_plan("kandinsky6"), model), model)
    slots = dict(resolved.pad_slots)
    for path in resolved.padded_attention:
        video = path.endswith(("video_dec_block.self_attention", "av_cross_attention"))
        assert slots[path] == (("first",) if video else ("last",)), path
    assert len(resolved.padded_attention) == 4 * len(model.visual_transformer_blocks)
