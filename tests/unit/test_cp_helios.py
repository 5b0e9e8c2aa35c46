"""Helios' forward with the cp cut before its joins (`runtime/cp/helios.py`, plan key `cp.forward: helios`).

At cp = 1 dtp's forward is diffusers' forward, bit for bit. At cp = 2 and 3 each rank's [history_r | current_r] rows of
the joint tokens, their RoPE rows, temb and the per-token modulation, as the first block and the output norm receive
them, are in rank order diffusers' whole tensors (each run's valid rows; the pad rows after them), and the pad slots
say where the pad rows are. Against diffusers' own forward, captured at the same module inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dtp
from dtp.plan.cp import cp_plan_from_mapping
from dtp.resolve import resolve, resolve_cp
from dtp.runtime.cp.helios import RunCut, helios_forward
from dtp.runtime.cp.hooks import PadState
from dtp.testing.perturb import perturb
from dtp.testing.tiny import tiny_inputs, tiny_model

CLASS = "HeliosTransformer3DModel"


def _model_and_inputs(frames: int = 2, **config):
    """Tiny Helios (perturbed weights), batch 2: `frames` current latent frames of 4 x 6 tokens and the histories on
    the same grid (short 24, mid 6, long 2 = 32 history tokens); 1 frame: 24 current tokens."""
    model = perturb(tiny_model(CLASS, **config), seed=3).eval()
    inputs = tiny_inputs(CLASS, batch=2, img_tokens=64, txt_tokens=8)
    for key in ("hidden_states", "latents_history_short", "latents_history_mid", "latents_history_long"):
        inputs[key] = inputs[key][..., :8, :12].contiguous()
    inputs["hidden_states"] = inputs["hidden_states"][:, :, :frames].contiguous()
    inputs["indices_hidden_states"] = inputs["indices_hidden_states"][:, :frames]
    return model, inputs


class _Seen(Exception):
    """Raised at the output norm: what comes after it (proj_out's gather, the unpatchify) is not under test."""


def _captured(model, run):
    """(block 0's (hidden_states, temb, rotary_emb, original_context_length), norm_out's temb) as `run()` calls them."""
    seen = {}

    def block(module, args):
        seen.setdefault("block", args[:1] + args[2:5])

    def norm(module, args):
        seen["norm"] = args[1]
        raise _Seen

    handles = [model.blocks[0].register_forward_pre_hook(block), model.norm_out.register_forward_pre_hook(norm)]
    try:
        with torch.no_grad(), pytest.raises(_Seen):
            run()
    finally:
        for handle in handles:
            handle.remove()
    return seen["block"], seen["norm"]


@pytest.mark.parametrize("case", ("default", "every token at t", "no history"))
def test_at_cp_1_it_is_diffusers_forward_bit_for_bit(case):
    """dtp's forward on the whole sequence (cp = 1): the same output as diffusers', also with the history modulated at
    t (`zero_history_timestep=False`) and without history latents."""
    model, inputs = _model_and_inputs(**({"zero_history_timestep": False} if case == "every token at t" else {}))
    if case == "no history":
        inputs = {k: v for k, v in inputs.items() if "history" not in k}
    with torch.no_grad():
        ref = model(**inputs)[0]
        out = helios_forward(model, **inputs, cut=RunCut(0, 1, None, False))[0]
    assert torch.equal(out, ref)


def _rows(x, first: int, count: int):
    return x[:, first : first + count]


@pytest.mark.parametrize("cp,frames", ((2, 2), (3, 1)))
def test_each_ranks_rows_in_rank_order_are_diffusers_whole_tensors(cp, frames):
    """cp = 2 (32 history + 48 current tokens, nothing padded) and cp = 3 (32 + 24: the history padded to 33): each
    rank's valid history rows, then its valid current rows, of the tokens, temb, the modulation and the RoPE rows,
    concatenated over ranks, equal diffusers' [history | current] bit for bit; the local count is the rank's current
    rows. Negative control: rank 0's rows are not rank 1's (the rows do depend on the rank's range)."""
    model, inputs = _model_and_inputs(frames)
    whole, whole_temb = _captured(model, lambda: model(**inputs))
    history = whole[0].shape[1] - whole[3]
    heads, tails = [], []
    for rank in range(cp):
        pads = PadState()
        cut = RunCut(rank, cp, pads, pad=True)
        local, temb = _captured(model, lambda c=cut: helios_forward(model, **inputs, cut=c))
        first, last = pads.slots["first"], pads.slots["last"]
        assert local[3] == last.local and local[0].shape[1] == first.local + last.local
        assert (first.total, last.total) == (history, whole[3])
        tensors = (*local[:3], temb)
        heads.append([_rows(x, 0, first.valid) for x in tensors])
        tails.append([_rows(x, first.local, last.valid) for x in tensors])
    for i, ref in enumerate((*whole[:3], whole_temb)):
        joined = torch.cat([torch.cat([h[i] for h in heads], 1), torch.cat([t[i] for t in tails], 1)], 1)
        assert torch.equal(joined, ref), i
    assert not torch.equal(tails[0][0], tails[1][0])  # the control: a range that matters


def test_the_plan_key_is_checked():
    """`cp.forward` takes a known name and a `pad` rule only; the bundled plan names `helios` and splits nothing else;
    on another model class the plan is refused before anything is hooked."""
    section = {"gather": {"o": {"dim": 1}}}
    for spec in ({"name": "flux"}, {"name": "helios", "tail": "n"}, "helios"):
        with pytest.raises(dtp.PlanError, match="cp.forward"):
            cp_plan_from_mapping({**section, "forward": spec}, "t")
    plan = dtp.load_plan("helios")
    assert plan.cp.forward.name == "helios" and plan.cp.splits == ()
    wan = tiny_model("WanTransformer3DModel")
    wan_plan = dtp.load_plan("wan")
    wan_plan = dataclasses.replace(wan_plan, cp=dataclasses.replace(wan_plan.cp, forward=plan.cp.forward))
    with pytest.raises(dtp.PlanError, match="cp.forward 'helios'"):
        resolve_cp(resolve(wan_plan, wan), wan)
