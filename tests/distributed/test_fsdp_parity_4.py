"""fsdp=True on 4 gloo ranks, (cp=2, tp=2): TP inside, FSDP across (torchtitan's 2-D layout), every tiny model.

One process group: FLUX.1, FLUX.2, Qwen-Image, Wan, HunyuanVideo and LTX-Video against diffusers' unsharded
forward, then the negative control (a shard from the wrong fsdp rank).
"""

from __future__ import annotations

import pytest
from fsdp_cases import FLUX, MODELS, TOL, check, rank_job, tag

from dtp.testing.launch import spawn

MESH = dict(cp=2, tp=2)


@pytest.fixture(scope="module")
def results():
    return spawn(rank_job, 4, [(MESH, MODELS)], (MESH, FLUX))


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
