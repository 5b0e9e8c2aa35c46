"""Cosmos 3 Omni's forward with the cp cut before its packing (`runtime/cp/cosmos3.py`, `cp.forward: cosmos3_omni`).

`PackedRows` places each pathway's rows as `sequence.padded_chunk` cuts them, and its read-back slot finds each global
row in the all-gather of every rank's rows; at cp = 1 dtp's forward is diffusers' forward bit for bit; at cp = 2 and 3
(both pathways padded) each rank's `und_seq`, `gen_seq` and four RoPE tables, as the first layer receives them, are in
rank order diffusers' tensors, pad rows zero. Against diffusers' own forward, captured at the first layer's input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dtp
from dtp.runtime.cp.cosmos3 import PackedRows, cosmos3_omni_forward
from dtp.runtime.cp.hooks import PadState
from dtp.runtime.cp.sequence import padded_chunk
from dtp.testing.cosmos3 import SOUND_ACTION, add_sound_and_action
from dtp.testing.first_call import first_call_args
from dtp.testing.perturb import perturb
from dtp.testing.tiny import tiny_model

CLASS = "Cosmos3OmniTransformer"


@settings(max_examples=40, deadline=None)
@given(cp=st.integers(1, 4), und=st.integers(0, 9), gen=st.integers(1, 13))
def test_rows_are_each_pathways_padded_chunk_and_slots_find_them(cp, und, gen):
    """Rank r's global rows are `padded_chunk` of each pathway's rows (pad -1); every global row's slot in the
    gather of all ranks' rows holds that row."""
    total = und + gen
    whole = torch.arange(total)
    gathered = []
    for rank in range(cp):
        cut = PackedRows(rank, cp, None, True)
        cut.cut(und, total)
        rows = cut.rows(total, "cpu")
        ref = [padded_chunk(part, 0, rank, cp, "x") for part in (whole[:und], whole[und:])]
        expect = torch.cat([torch.where(torch.arange(len(c)) < v, c, -1) for c, v in ref])
        assert torch.equal(rows, expect)
        gathered.append(rows)
    assert torch.equal(torch.cat(gathered)[cut.slot(whole)], whole)


def test_rows_without_pad_refuse_a_pathway_cp_does_not_divide():
    with pytest.raises(dtp.ForwardError, match="gen_seq: 5 tokens are not divisible"):
        PackedRows(0, 2, None, False).cut(4, 9)


def _model_and_inputs():
    """Tiny Cosmos 3 (perturbed weights): 7 text tokens, then 3 latent frames of 2 x 3 patches (18 video tokens),
    frame 0 a clean condition, frames 1-2 noisy and read back."""
    model = perturb(tiny_model(CLASS), seed=3).eval()
    g = torch.Generator().manual_seed(13)
    text, frames, h, w = 7, 3, 2, 3
    video = torch.arange(text, text + frames * h * w)
    grid = torch.stack(torch.meshgrid(*(torch.arange(n) for n in (frames, h, w)), indexing="ij")).flatten(1)
    inputs = dict(
        input_ids=torch.randint(0, model.config.vocab_size, (text,), generator=g),
        text_indexes=torch.arange(text),
        position_ids=torch.cat([torch.arange(text).expand(3, -1), grid + text], dim=1),
        und_len=text,
        sequence_length=text + len(video),
        vision_tokens=[torch.randn(1, model.config.latent_channel, frames, h * 2, w * 2, generator=g)],
        vision_token_shapes=[(frames, h, w)],
        vision_sequence_indexes=video,
        vision_mse_loss_indexes=video[h * w :],
        vision_timesteps=torch.rand((frames - 1) * h * w, generator=g) * 1000,
        vision_noisy_frame_indexes=[torch.arange(1, frames)],
        return_dict=False,
    )
    return model, inputs


def _layer_inputs(model, run):
    """(und_seq, gen_seq, rotary_emb) as `run()` hands them to the first decoder layer."""
    args = first_call_args(model.layers[0], run)
    return args


def test_at_cp_1_it_is_diffusers_forward_bit_for_bit():
    model, inputs = _model_and_inputs()
    with torch.no_grad():
        ref = model(**inputs)[0][0]
        out = cosmos3_omni_forward(model, **inputs, cut=PackedRows(0, 1, None, False))[0][0]
    assert torch.equal(out, ref)


@pytest.mark.parametrize("cp", (2, 3))
def test_each_ranks_rows_in_rank_order_are_diffusers_tensors(cp):
    """7 text + 18 video tokens: text padded to 8 at cp = 2 and to 9 at cp = 3, video to 18 / 18 (cp = 2: none).
    Each rank's valid rows of und_seq and the four RoPE tables, concatenated over ranks, equal diffusers' bit for
    bit, gen_seq's to fp32 rounding (below); pad rows are zero; the slots hold the rank's counts. Control: rank 0's
    rows differ from rank 1's."""
    model, inputs = _model_and_inputs()
    und, gen, rope = _layer_inputs(model, lambda: model(**inputs))
    pieces = []
    for rank in range(cp):
        pads = PadState()
        cut = PackedRows(rank, cp, pads, pad=True)
        local = _layer_inputs(model, lambda c=cut: cosmos3_omni_forward(model, **inputs, cut=c))
        first, last = pads.slots["first"], pads.slots["last"]
        assert (first.local, first.total, last.local, last.total) == (-(-7 // cp), 7, -(-18 // cp), 18)
        assert local[0].shape[0] == first.local and local[1].shape[0] == last.local
        runs = (first.valid, last.valid, first.valid, first.valid, last.valid, last.valid)
        tensors = (local[0], local[1], *local[2])
        pieces.append([t[:n] for t, n in zip(tensors, runs)])
        assert all(not t[n:].any() for t, n in zip(tensors, runs))  # pad rows zero
    for i, whole in enumerate((und, *rope)):
        assert torch.equal(torch.cat([p[(0, 2, 3, 4, 5)[i]] for p in pieces]), whole), i
    # the video rows: bit for bit but for the noisy rows' timestep MLP (fp32 Linear), which CPU BLAS rounds by the
    # row count it is given (the rank's rows, not all of them): 4.8e-6 off at cp = 3 (values up to 5), 0 at cp = 2
    torch.testing.assert_close(torch.cat([p[1] for p in pieces]), gen, rtol=1e-6, atol=2e-5)
    assert not torch.equal(pieces[0][1][:4], pieces[1][1][:4])


def _with_sound_and_action():
    """A tiny Cosmos 3 built with its sound and action heads: 7 text, 18 video, then 5 sound tokens (frames 1-4 noisy)
    and 4 action tokens (frames 2-3 noisy, domain 1) in the generation pathway (34 rows)."""
    torch.manual_seed(0)
    config = dict(dtp.families.FAMILIES[CLASS].tiny, **SOUND_ACTION)
    model = perturb(type(tiny_model(CLASS)).from_config(config), seed=3).eval()
    _, inputs = _model_and_inputs()
    g = torch.Generator().manual_seed(5)
    add_sound_and_action(inputs, g)
    with torch.no_grad():  # the modality embeddings are zeros at init: make them count
        model.audio_modality_embed.normal_(generator=g)
        model.action_modality_embed.normal_(generator=g)
    return model, inputs


def test_sound_and_action_at_cp_1_and_their_rows_at_cp_3():
    """With sound and action tokens: at cp = 1 every output (video, sound, action) is diffusers' (to rounding); at
    cp = 3 (text 7 -> 9, generation 27 -> 27) each rank's gen_seq rows in rank order are diffusers' (to fp32
    rounding, as above). Control: the sound rows are not zero (the sound tokens were packed)."""
    model, inputs = _with_sound_and_action()
    with torch.no_grad():
        ref = model(**inputs)
        out = cosmos3_omni_forward(model, **inputs, cut=PackedRows(0, 1, None, False))
    # to fp32 rounding here: the timestep MLP runs on the 34 rows of the rank (diffusers: on each modality's 12 / 4 /
    # 2 noisy rows), which CPU BLAS rounds by row count: video 4.8e-7, sound 3.6e-7, action 3.3e-6 of 11.1 seen
    for ours, theirs in zip(out, ref):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)
    _, gen, _ = _layer_inputs(model, lambda: model(**inputs))
    rows = []
    for rank in range(3):
        pads = PadState()
        cut = PackedRows(rank, 3, pads, pad=True)
        local = _layer_inputs(model, lambda c=cut: cosmos3_omni_forward(model, **inputs, cut=c))
        rows.append(local[1][: pads.slots["last"].valid])
    torch.testing.assert_close(torch.cat(rows), gen, rtol=1e-6, atol=2e-5)
    assert gen[18:].abs().min(dim=-1).values.gt(0).all()
