"""`cp.per_sample` (`runtime/cp/per_sample.py`): a cross-attention whose context is each sample's repeated once per
frame, its keys / values projected once per sample. One process, diffusers' `Attention` with `AttnProcessor2_0` on
[B x F, P, D] queries and the context `repeat_interleave`d per frame, as Latte's forward builds it: the adapter's
output within 1e-6 of the processor's. Negative control: the context of the wrong sample (the first B rows)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0
from torch import nn

import dtp.runtime.cp.per_sample as per_sample
from dtp import PlanError
from dtp.plan.cp import cp_plan_from_mapping
from dtp.resolve.binding.cp import _per_sample
from dtp.runtime.cp.framewise import Samples

B, F, P, L, D, HEADS = 2, 3, 4, 5, 16, 2


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn2 = Attention(D, cross_attention_dim=D, heads=HEADS, dim_head=D // HEADS, processor=AttnProcessor2_0())

    def forward(self, hidden_states, queries, context):
        return self.attn2(queries, encoder_hidden_states=context)


def _error(broken: bool = False) -> float:
    torch.manual_seed(3)
    model = _Model()
    queries, caption = torch.randn(B * F, P, D), torch.randn(B, L, D)
    context = caption.repeat_interleave(F, dim=0)  # Latte's forward: sample-major, one copy per frame
    with torch.no_grad():
        ref = model(torch.zeros(B, 1), queries, context)
        handles = per_sample.install_per_sample(model, [("attn2", "hidden_states")])
        if broken:
            per_sample.one_per_sample = lambda rows, frames: rows[: rows.shape[0] // frames]
        out = model(torch.zeros(B, 1), queries, context)
        for handle in handles:
            handle.remove()
    assert isinstance(model.attn2.processor, AttnProcessor2_0)  # removed: the original back
    return float((out - ref).abs().max() / ref.abs().max())


def test_keys_once_per_sample_match_the_processor():
    assert _error() <= 1e-6


def test_the_context_of_the_wrong_sample_fails(monkeypatch):
    monkeypatch.setattr(per_sample, "one_per_sample", per_sample.one_per_sample)  # restored after the test
    assert _error(broken=True) > 1e-2


def test_the_batch_input_is_recorded_per_forward():
    samples = Samples(_Model(), ["hidden_states"])
    samples.record(None, (torch.zeros(3, 1), None, None), {})
    assert samples.of("hidden_states", "x") == 3


def test_per_sample_must_be_local():
    data = {"split": {"pos_embed": {0: {"dim": 1, "output": True}}}, "gather": {"proj_out": {"dim": 1}}}
    with pytest.raises(PlanError, match="must also be in cp.local"):
        cp_plan_from_mapping({**data, "per_sample": {"blocks.*.attn2": "hidden_states"}}, "x")
    plan = cp_plan_from_mapping({**data, "local": ["blocks.*.attn2"], "per_sample": {"blocks.*.attn2": "x"}}, "x")
    assert plan.per_sample == (("blocks.*.attn2", "x"),)


@pytest.mark.parametrize("batch_of,swap", [("hidden_states", True), ("queries_of", False)])
def test_resolve_refuses_another_processor_or_input(batch_of, swap):
    """A processor the adapter does not copy (`AttnProcessor`), or a model input that does not exist: PlanError."""
    model = _Model()
    if swap:
        model.attn2.set_processor(AttnProcessor())
    with pytest.raises(PlanError, match="runs AttnProcessor;" if swap else "no forward"):
        _per_sample(_plan(batch_of), model)
    assert _per_sample(_plan("hidden_states"), _Model()) == (("attn2", "hidden_states"),)


def _plan(batch_of: str):
    return SimpleNamespace(name="x", cp=SimpleNamespace(per_sample=(("attn2", batch_of),)))
