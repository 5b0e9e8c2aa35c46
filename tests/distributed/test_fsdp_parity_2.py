"""fsdp=True on 2 gloo ranks: every tiny model on (cp=2) and (cfg=2) meshes against diffusers' unsharded forward.

One process group: FLUX.1, FLUX.2, Qwen-Image, Wan, HunyuanVideo and LTX-Video on cp=2 (Ulysses) and on cfg=2
(a batch of 2: each cfg group runs one half, both groups gather the same blocks), then the negative control. By
default the models take the two meshes in turn (FLUX.1, Qwen-Image, HunyuanVideo at cp=2; FLUX.2, Wan, LTX-Video at
cfg=2); both with DTP_FULL=1.
"""

from __future__ import annotations

import pytest
from fsdp_cases import FLUX, MODELS, TOL, check, rank_job, tag

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run

MESHES = (dict(cp=2), dict(cfg=2))


def _runs(mesh: int, cls: str) -> bool:
    """By default each model on one mesh, the models taking cp=2 and cfg=2 in turn (FLUX.1 at cp=2, where the negative
    control runs); every model on both with DTP_FULL=1 (every model with tp too: test_fsdp_parity_4.py)."""
    return full_run() or MODELS.index(cls) % len(MESHES) == mesh


RUNS = [(dims, tuple(cls for cls in MODELS if _runs(i, cls))) for i, dims in enumerate(MESHES)]
CASES = [
    pytest.param(dims, cls, id=f"{tag(dims)}-{cls}", marks=() if _runs(i, cls) else pytest.mark.full)
    for i, dims in enumerate(MESHES)
    for cls in MODELS
]


@pytest.fixture(scope="module")
def results():
    return spawn(rank_job, 2, RUNS, (MESHES[0], FLUX))


@pytest.mark.parametrize("dims, cls", CASES)
def test_fsdp_matches_one_process(results, dims, cls):
    """tp=1, fsdp over 2 ranks: max |out - ref| <= 1e-5 * max |ref|, twice; resident parameters <= 1.05 x whole / 2 +
    the two largest blocks; no module runs with a DTensor parameter (FSDP2's gathered parameters are plain)."""
    check(results, (tag(dims), cls), world=2, tp=1)


def test_shard_from_the_wrong_rank_fails(results):
    """Negative control: one block weight's shards swapped between the ranks breaks the tolerance."""
    for per_rank in results:
        r = per_rank[("broken", FLUX)]
        assert r["diff"] > TOL * r["ref"], r


def test_tp1_without_fsdp_runs_plain_tensors(results):
    """The same cp=2 mesh without fsdp: at tp=1 no module runs with a DTensor parameter either (dtp leaves TP out)."""
    for per_rank in results:
        r = per_rank[("plain", FLUX)]
        assert r["diff"] <= TOL * r["ref"], r
        assert r["local"] == r["whole"] and r["dtensor_modules"] == [], r["dtensor_modules"][:5]
