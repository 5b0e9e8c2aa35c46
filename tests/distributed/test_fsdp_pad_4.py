"""fsdp=True with pad=True on 4 gloo ranks, (cp=2, tp=2), one process group.

Tiny FLUX.1 with 3 attention heads: tp=2 does not divide them, so pad=True zero-pads them to 4 (a multiple of
tp * cp under Ulysses) and FSDP2 shards the padded TP slices over the 2 cp ranks. Pad only pads at tp > 1, and
2 ranks cannot hold tp > 1 next to a non-tp axis, hence 4 ranks. Against diffusers' unsharded 3-head model; the
same model without pad is a PlanError; the negative control puts a shard from the wrong fsdp rank in a block.
"""

from __future__ import annotations

import pytest
import torch
from fsdp_cases import TOL, wrong_rank_shard

from dtp.testing.launch import spawn
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"
THREE_HEADS = dict(num_attention_heads=3)
MESH = dict(cp=2, tp=2)


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 4, timeout_s=600)


def _worker(rank, world):
    import dtp

    mesh = dtp.make_mesh(**MESH)
    try:
        dtp.parallelize(tiny_model(FLUX, **THREE_HEADS), mesh, fsdp=True)
        unpadded = None
    except ValueError as error:  # PlanError
        unpadded = f"{type(error).__name__}: {error}"
    return dict(unpadded=unpadded, padded=_padded(mesh), broken=_padded(mesh, broken=True))


@torch.no_grad()
def _padded(mesh, broken: bool = False) -> dict:
    import dtp
    from dtp.runtime.parallelism import Parallelism

    inputs = tiny_inputs(FLUX)
    ref = output_tensor(tiny_model(FLUX, **THREE_HEADS)(**inputs)).float()
    model = dtp.parallelize(tiny_model(FLUX, **THREE_HEADS), mesh, pad=True, fsdp=True)
    if broken:
        wrong_rank_shard(model, Parallelism(mesh, fsdp=True).fsdp_mesh)
    outs = [output_tensor(model(**inputs)).float() for _ in range(2)]  # the second call gathers again
    return dict(
        diff=max(float((o - ref).abs().max()) for o in outs),
        ref=float(ref.abs().max()),
        local_heads=model.transformer_blocks[0].attn.heads,
    )


def test_pad_with_fsdp_matches_one_process(results):
    """3 heads padded to 4, 2 per tp rank, FSDP2 across cp: max |out - ref| <= 1e-5 * max |ref|, twice (measured
    2.1e-6 of 3.67: 5.8e-7 relative)."""
    for rank in results:
        r = rank["padded"]
        assert r["local_heads"] == 2, r  # 4 padded heads over tp=2 (3 could not be split)
        assert r["diff"] <= TOL * r["ref"], r


def test_unpadded_is_refused(results):
    """Without pad: a PlanError suggesting pad=True, on every rank."""
    for rank in results:
        message = rank["unpadded"]
        assert message is not None and message.startswith("PlanError") and "pad=True" in message, message


def test_shard_from_the_wrong_rank_fails(results):
    """Negative control: a block weight's fsdp shards rotated between the cp ranks breaks the tolerance."""
    for rank in results:
        r = rank["broken"]
        assert r["diff"] > TOL * r["ref"], r
