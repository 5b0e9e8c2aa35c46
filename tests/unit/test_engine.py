"""parallelize, from_pretrained and `dtp check` share one engine: the same bad plan raises the same
PlanError from all three, before anything is mutated (parallelize: the model is untouched;
from_pretrained: no tensor was read; check: nothing to mutate but the same message)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

import dtp
import dtp.loading.load
from dtp.analysis.check import measure
from dtp.testing.tiny import TINY_CONFIGS, model_class, tiny_model

FLUX = "FluxTransformer2DModel"
SIX_HEADS = dict(num_attention_heads=6, attention_head_dim=16)  # tp=4 divides the widths (96), not the heads
PAIR = {"transformer_blocks.*.attn.to_q": "colwise", "transformer_blocks.*.attn.to_out.0": "rowwise"}
BAD = {
    "key matches nothing": {**PAIR, "transformer_blocks.*.attn.to_nothing": "colwise"},
    "colwise without a rowwise partner": {"transformer_blocks.*.ff.net.0.proj": "colwise"},
    "a target that is not a Linear": {**PAIR, "transformer_blocks.*.norm1": "colwise"},
    "tp does not divide the heads": PAIR,
}


def plan(case: str) -> dtp.Plan:
    return dtp.Plan.from_dict(BAD[case], name=case)


@pytest.fixture(scope="module")
def check_messages():
    """`dtp check`'s message per case (it runs its own fake world, so it goes first)."""
    messages = {}
    for case in BAD:
        with pytest.raises(dtp.PlanError) as info:
            measure(FLUX, plan(case), tp=4, config={**TINY_CONFIGS[FLUX], **SIX_HEADS}, dtype="fp32", forward=False)
        messages[case] = str(info.value)
    return messages


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("six-heads")
    tiny_model(FLUX, **SIX_HEADS).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def mesh(check_messages, fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, [
        (name, getattr(m, "heads", None)) for name, m in model.named_modules()
    ]


@pytest.mark.parametrize("case", sorted(BAD))
def test_three_entry_points_raise_the_same_error_before_mutating(case, check_messages, mesh, saved, monkeypatch):
    model = tiny_model(FLUX, **SIX_HEADS)
    tensors, heads = snapshot(model)
    with pytest.raises(dtp.PlanError) as from_parallelize:
        dtp.parallelize(model, mesh, plan(case))
    after, after_heads = snapshot(model)
    assert after_heads == heads and all(
        not isinstance(v, DTensor) and torch.equal(v, tensors[k]) for k, v in after.items()
    )

    reads = []
    monkeypatch.setattr(dtp.loading.load, "_read_into", lambda *a, **k: reads.append(1))
    with pytest.raises(dtp.PlanError) as from_loader:
        dtp.from_pretrained(model_class(FLUX), str(saved), mesh, plan(case))
    assert reads == []

    assert str(from_parallelize.value) == str(from_loader.value) == check_messages[case]


def test_prepare_then_apply_is_parallelize(mesh):
    """The engine's two halves, called directly, shard exactly as `parallelize` does."""
    a, b = tiny_model(FLUX), tiny_model(FLUX)
    dtp.parallelize(a, mesh, dtp.load_plan("flux"))
    prepared = dtp.prepare(b, mesh, dtp.load_plan("flux"))
    assert not any(isinstance(p, DTensor) for p in b.parameters())  # prepare mutates nothing
    dtp.apply(b, prepared)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        local = [p.to_local() if isinstance(p, DTensor) else p for p in (pa, pb)]
        assert type(pa) is type(pb) and torch.equal(*local), name
