"""The cuts the issue-45 video plans added: `tail` (a split at a global token index), `strided`, per-token frames,
a ModuleList indexed from its end, and their plan checks. Pure functions against independent constructions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
from dtp.plan.cp import cp_plan_from_mapping
from dtp.resolve.binding.globs import expand
from dtp.runtime.cp.frames import frame_of_tokens, frame_size
from dtp.runtime.cp.strided import strided_chunk
from dtp.runtime.cp.tail import tail_chunk


@settings(max_examples=40, deadline=None)
@given(cp=st.integers(1, 4), head=st.integers(0, 5), tail=st.integers(0, 5))
def test_tail_chunks_are_each_runs_own_chunks(cp, head, tail):
    """Rank r's [head_r | tail_r]: concatenated over ranks, the head runs give the head and the tail runs the tail."""
    x = torch.arange((head + tail) * cp).float().unsqueeze(0)  # [1, n], n a multiple of cp
    n_head, n_tail = head * cp, tail * cp
    pieces = [tail_chunk(x, 1, n_tail, r, cp, "x") for r in range(cp)]
    assert all(p[1].local == head and p[2].local == tail for p in pieces)
    heads = torch.cat([p[0][:, :head] for p in pieces], 1)
    tails = torch.cat([p[0][:, head:] for p in pieces], 1)
    assert torch.equal(heads, x[:, :n_head]) and torch.equal(tails, x[:, n_head:])


def test_tail_pad_pads_each_run():
    """11 history + 6 current at cp=4: runs padded to 12 and 8; rank 3 holds 2 real history, 0 real current."""
    x = torch.arange(17).float().unsqueeze(0)
    chunk, head, rest = tail_chunk(x, 1, 6, 3, 4, "x", pad=True)
    assert (head.local, head.valid, head.total) == (3, 2, 11)
    assert (rest.local, rest.valid, rest.total) == (2, 0, 6)
    assert chunk.tolist() == [[9.0, 10.0, 0.0, 0.0, 0.0]]
    with pytest.raises(dtp.ForwardError, match="not divisible"):
        tail_chunk(x, 1, 6, 0, 4, "x")


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_strided_chunk_keeps_every_cp_th_row_from_rank(cp):
    x = torch.arange(24).reshape(8, 3)
    for rank in range(cp):
        assert torch.equal(strided_chunk(x, 0, rank, cp, "x"), x[rank::cp])


def test_strided_rows_stay_in_their_sample():
    """B = 2 samples repeated over P = 4 positions: each rank's local row k belongs to sample k // (P / cp)."""
    rows = torch.tensor([0, 1]).repeat_interleave(4)  # a a a a b b b b
    for rank in range(2):
        assert strided_chunk(rows, 0, rank, 2, "t").tolist() == [0, 0, 1, 1]


def test_frames_of_a_token_range():
    per_frame = frame_size(12, 3)
    assert frame_of_tokens(3, 3, per_frame, "cpu").tolist() == [0, 1, 1]
    with pytest.raises(dtp.ForwardError, match="equal frames"):
        frame_size(10, 3)


def test_modulelist_from_its_end():
    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    assert [path for path, _ in expand(model, "blocks.-1", "t")] == ["blocks.2"]
    assert expand(model, "blocks.-3", "t")[0][1] is model.blocks[0]
    with pytest.raises(dtp.PlanError, match="does not exist"):
        expand(model, "blocks.-4", "t")


def _section(spec: dict) -> dict:
    return {"split": {"blocks.0": {"hidden_states": spec}}, "gather": {"proj_out": {"dim": 1}}}


@pytest.mark.parametrize(
    "spec",
    [
        {"dim": 1, "tail": "n", "pad": {"at": "last", "attention": ["a"]}},
        {"dim": 1, "strided": True, "tail": "n"},
        {"dim": 1, "element": -1},
        {"dim": 1, "tail": 3},
    ],
)
def test_bad_video_cuts_are_plan_errors(spec):
    with pytest.raises(dtp.PlanError):
        cp_plan_from_mapping(_section(spec), "t")


def test_video_cuts_parse():
    rule = cp_plan_from_mapping(_section({"dim": 1, "tail": "n", "pad": {"at": "first", "attention": ["a"]}}), "t")
    assert rule.splits[0].tail == "n" and rule.splits[0].pad.at == "first"
    assert cp_plan_from_mapping(_section({"dim": 0, "strided": True}), "t").splits[0].strided
    assert cp_plan_from_mapping(_section({"dim": 1, "element": 1}), "t").splits[0].element == 1
