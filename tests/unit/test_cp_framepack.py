"""FramePack's forward with the cp cut before its packing (`runtime/cp/framepack.py`, plan key `cp.forward: framepack`).

`JointCut.rows` of several pieces is the padded chunk of their join (`sequence.padded_chunk` of the `cat`), for any
lengths; at cp = 1 dtp's forward is diffusers' forward bit for bit; at cp = 2 and 3 each rank's packed tokens and RoPE
rows, as the first block receives them, are in rank order diffusers' packed tensors, and the pad slot and the `forward`
split id say where the rank's rows lie. Against diffusers' own forward, captured at the first block's input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dtp
from dtp.runtime.cp.framepack import FORWARD_ID, JointCut, framepack_forward
from dtp.runtime.cp.hooks import PadState
from dtp.runtime.cp.sequence import padded_chunk
from dtp.testing.first_call import first_call_args
from dtp.testing.perturb import perturb
from dtp.testing.tiny import tiny_inputs, tiny_model

CLASS = "HunyuanVideoFramepackTransformer3DModel"


@settings(max_examples=40, deadline=None)
@given(cp=st.integers(1, 4), lengths=st.lists(st.integers(0, 7), min_size=1, max_size=4))
def test_rows_of_pieces_are_the_padded_chunk_of_their_join(cp, lengths):
    """Rank r's rows of [a | b | c ...] without the join: `padded_chunk(cat(pieces))`, valid count and total alike."""
    pieces = [torch.randn(2, n, 3) for n in lengths]
    whole = torch.cat(pieces, dim=1)
    for rank in range(cp):
        chunk, valid, total = JointCut(rank, cp, None, True).rows(pieces, 1, "x")
        ref, ref_valid = padded_chunk(whole, 1, rank, cp, "x")
        assert torch.equal(chunk, ref) and (valid, total) == (ref_valid, whole.shape[1])


def test_rows_without_pad_refuse_a_length_cp_does_not_divide():
    with pytest.raises(dtp.ForwardError, match="not divisible"):
        JointCut(0, 2, None, False).rows([torch.zeros(1, 3), torch.zeros(1, 2)], 1, "x")


def _model_and_inputs():
    """Tiny FramePack (perturbed weights), batch 2: 1 4x + 8 2x + 16 clean history tokens, then 16 noisy (41)."""
    model = perturb(tiny_model(CLASS), seed=3).eval()
    inputs = tiny_inputs(CLASS, batch=2)
    g = torch.Generator().manual_seed(11)
    inputs["latents_history_2x"] = torch.randn(2, 4, 3, 8, 8, generator=g)
    inputs["indices_latents_history_2x"] = torch.arange(1, 4)
    return model, inputs


def _block_inputs(model, run):
    """(hidden_states, image_rotary_emb) as `run()` hands them to the first dual-stream block."""
    args = first_call_args(model.transformer_blocks[0], run)
    return (args[0], args[4])


def test_at_cp_1_it_is_diffusers_forward_bit_for_bit():
    model, inputs = _model_and_inputs()
    with torch.no_grad():
        ref = model(**inputs)[0]
        out = framepack_forward(model, **inputs, cut=JointCut(0, 1, None, False))[0]
    assert torch.equal(out, ref)


@pytest.mark.parametrize("cp", (2, 3))
def test_each_ranks_packed_rows_in_rank_order_are_diffusers_packed_tensors(cp):
    """41 packed tokens: padded to 42 at cp = 2 and to 42 at cp = 3 (14 a rank). Each rank's valid token and RoPE
    (cos, sin) rows, concatenated over ranks, equal diffusers' packed tensors bit for bit; the `first` slot and the
    `forward` id hold the rank's rows. Control: rank 0's rows differ from rank 1's."""
    model, inputs = _model_and_inputs()
    tokens, (cos, sin) = _block_inputs(model, lambda: model(**inputs))
    pieces = []
    for rank in range(cp):
        pads = PadState()
        cut = JointCut(rank, cp, pads, pad=True)
        local, (local_cos, local_sin) = _block_inputs(model, lambda c=cut: framepack_forward(model, **inputs, cut=c))
        slot = pads.slots["first"]
        assert pads.lengths[FORWARD_ID] == (local.shape[1], tokens.shape[1]) == (slot.local, slot.total)
        assert pads.names["hidden_states"] == "first" and slot.padded == (slot.local * cp != slot.total)
        pieces.append((local[:, : slot.valid], local_cos[: slot.valid], local_sin[: slot.valid]))
    assert torch.equal(torch.cat([p[0] for p in pieces], 1), tokens)
    assert torch.equal(torch.cat([p[1] for p in pieces], 0), cos)
    assert torch.equal(torch.cat([p[2] for p in pieces], 0), sin)
    assert not torch.equal(pieces[0][0][:, :8], pieces[1][0][:, :8])
