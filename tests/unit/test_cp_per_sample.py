"""`cp.per_sample` (`runtime/cp/per_sample.py`): a cross-attention to a context the forward repeats once per frame,
its keys / values projected once per sample. One process, Latte's arrangement in small: a context projection
[B, L, D], the forward's `repeat_interleave(F, dim=0)`, diffusers' `Attention` with `AttnProcessor2_0` on [B x F, P, D]
queries: the adapter's output within 1e-6 of the processor's, with or without a mask (the mask falls back to the
processor on the rebuilt context). Negative control: the queries grouped frame-major (frames of the wrong sample)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0
from torch import nn

import dtp.runtime.cp.per_sample as per_sample
from dtp import ForwardError, PlanError
from dtp.plan.cp import cp_plan_from_mapping
from dtp.resolve.binding.cp import _per_sample

B, F, P, L, D, HEADS = 2, 3, 4, 5, 16, 2


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.caption_projection = nn.Linear(D, D)
        self.attn2 = Attention(D, cross_attention_dim=D, heads=HEADS, dim_head=D // HEADS, processor=AttnProcessor2_0())

    def forward(self, queries, caption, mask=None):
        caption = self.caption_projection(caption)
        context = caption.repeat_interleave(F, dim=0)  # Latte's forward: sample-major, one copy per frame
        return self.attn2(queries, encoder_hidden_states=context, attention_mask=mask)


def _error(mask: bool = False) -> float:
    torch.manual_seed(3)
    model = _Model()
    queries, caption = torch.randn(B * F, P, D), torch.randn(B, L, D)
    keep = torch.rand(B * F, L) > 0.3 if mask else None
    with torch.no_grad():
        ref = model(queries, caption, keep)
        handles = per_sample.install_per_sample(model, [("attn2", "caption_projection")])
        out = model(queries, caption, keep)
        for handle in handles:
            handle.remove()
        assert isinstance(model.attn2.processor, AttnProcessor2_0) and "forward" not in vars(model.caption_projection)
    return float((out - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("mask", [False, True])
def test_keys_once_per_sample_match_the_processor(mask):
    assert _error(mask) <= 1e-6


def test_frames_of_the_wrong_sample_fail(monkeypatch):
    """The queries grouped frame-major ([F, B x P]): a sample's frames attend to another sample's caption."""
    monkeypatch.setattr(
        per_sample,
        "by_sample",
        lambda x, batch: x.view(-1, batch, *x.shape[1:]).transpose(0, 1).reshape(batch, -1, x.shape[-1]),
    )
    assert _error() > 1e-2


def test_a_context_computed_on_before_the_attention_is_refused():
    """The forward computed on the stand-in (a float context reached the attention): a ForwardError naming it."""
    model = _Model()
    per_sample.install_per_sample(model, [("attn2", "caption_projection")])
    model.caption_projection.forward = lambda x: torch.randn(B, L, D)  # the stand-in bypassed
    with pytest.raises(ForwardError, match="did not run|stand-in"), torch.no_grad():
        model(torch.randn(B * F, P, D), torch.randn(B, L, D))


def test_per_sample_must_be_local():
    data = {"split": {"pos_embed": {0: {"dim": 1, "output": True}}}, "gather": {"proj_out": {"dim": 1}}}
    with pytest.raises(PlanError, match="must also be in cp.local"):
        cp_plan_from_mapping({**data, "per_sample": {"blocks.*.attn2": "caption_projection"}}, "x")
    plan = cp_plan_from_mapping({**data, "local": ["blocks.*.attn2"], "per_sample": {"blocks.*.attn2": "c"}}, "x")
    assert plan.per_sample == (("blocks.*.attn2", "c"),)


@pytest.mark.parametrize("context,swap", [("caption_projection", True), ("caption_proj", False)])
def test_resolve_refuses_another_processor_or_a_missing_module(context, swap):
    """A processor the adapter does not copy (`AttnProcessor`), or a context module that does not exist: PlanError."""
    model = _Model()
    if swap:
        model.attn2.set_processor(AttnProcessor())
    with pytest.raises(PlanError, match="runs AttnProcessor;" if swap else "caption_proj"):
        _per_sample(_plan(context), model)
    assert _per_sample(_plan("caption_projection"), _Model()) == (("attn2", "caption_projection"),)


def _plan(context: str):
    return SimpleNamespace(name="x", cp=SimpleNamespace(per_sample=(("attn2", context),)))
