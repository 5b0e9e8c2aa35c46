"""pad=True at tp=1 on a Ulysses cp mesh: padding lives in the tp shards, so `prepare` refuses a plan that would
need padded heads there (before: accepted, then a ForwardError at the first forward), and leaves the model as it was."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxTransformer2DModel

import dtp
from dtp.families import flux


def _three_heads() -> FluxTransformer2DModel:
    torch.manual_seed(0)
    return FluxTransformer2DModel(**{**flux.TINY, "num_attention_heads": 3})


def test_ulysses_padding_at_tp1_is_refused_before_any_change(fake_world):
    model = _three_heads()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mesh = dtp.make_mesh(tp=1, cp=4)
    with pytest.raises(dtp.PlanError, match=r"pad=True at tp=1 .*3 -> 4.*cp_mode='ring'"):
        dtp.parallelize(model, mesh, pad=True)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_ring_needs_no_padding_at_tp1(fake_world):
    """The control: ring attention takes any head count, so the same model and mesh prepare without padding."""
    prepared = dtp.prepare(_three_heads(), dtp.make_mesh(tp=1, cp=4), pad=True, cp_mode="ring")
    assert prepared.padding is None or prepared.padding.is_noop
