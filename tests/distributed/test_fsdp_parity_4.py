"""fsdp=True on 4 gloo ranks, (cp=2, tp=2): TP inside, FSDP across (torchtitan's 2-D layout), every tiny model.

One process group: FLUX.1, FLUX.2, Qwen-Image, Wan, HunyuanVideo and LTX-Video against diffusers' unsharded
forward, then the negative control (a shard from the wrong fsdp rank); NucleusMoE's routed experts (the `experts`
style, each tp rank a slice of every expert) with fsdp over (cfg=2, tp=2), and its control.
"""

from __future__ import annotations

import pytest
from fsdp_cases import FLUX, MODELS, MOE, TOL, check, rank_job, tag

from dtp.testing.launch import spawn

MESH = dict(cp=2, tp=2)
MOE_MESH = dict(cfg=2, tp=2)  # NucleusMoE refuses cp (expert-choice routing over the whole sequence)


@pytest.fixture(scope="module")
def results():
    return spawn(rank_job, 4, [(MESH, MODELS)], (MESH, FLUX), MOE_MESH)


@pytest.mark.parametrize("cls", MODELS)
def test_fsdp_tp_matches_one_process(results, cls):
    """cp=2 x tp=2 with fsdp: max |out - ref| <= 1e-5 * max |ref|, twice; resident parameters <= 1.05 x whole / 4 +
    the two largest blocks / 2."""
    check(results, (tag(MESH), cls), world=4, tp=2)


def test_shard_from_the_wrong_rank_fails(results):
    """Negative control: one block weight's fsdp shards rotated between the cp ranks breaks the tolerance."""
    for per_rank in results:
        r = per_rank[("broken", FLUX)]
        assert r["diff"] > TOL * r["ref"], r


def test_experts_with_fsdp_match_one_process(results):
    """The experts style composes with fsdp: FSDP2 shards the fused 3-D expert weights (already tp slices of every
    expert) over the cfg ranks; a batch of 2 on (cfg=2, tp=2) within 1e-5 x max |ref| of diffusers' one process
    (measured 4.2e-7), twice; resident parameters <= 1.05 x whole / 4 + the two largest blocks / 2."""
    check(results, ("moe", MOE), world=4, tp=2)


def test_expert_shard_from_the_wrong_rank_fails(results):
    """Negative control: the first expert weight's fsdp shards rotated between the cfg ranks breaks the tolerance."""
    for per_rank in results:
        r = per_rank[("broken", MOE)]
        assert r["diff"] > TOL * r["ref"], r
