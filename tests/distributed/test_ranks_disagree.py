"""Ranks that disagree fail fast: 2 gloo ranks, rank 1 differs in one thing per case, every rank raises PlanError.

One spawned group runs every case in turn (so the group also survives each refused call); each case
is timed on each rank. Without the agreement step these cases hang in the forward or crash with
"Connection reset by peer"; the spawn timeout turns a hang into a failure here instead of a stuck run.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from torch.distributed.tensor import DTensor

import dtp
from dtp.analysis.collectives import CollectiveCounter, implied_collectives
from dtp.testing.launch import spawn
from dtp.testing.tiny import model_class, output_tensor, tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"
FAST_S = 10.0  # a refused call returns within this many seconds on every rank (measured: well under 1 s)
DIGEST_GATHER = ("allgather", 2 * 32)  # the whole cost of agreeing: a 32-byte digest from each of 2 ranks


def _flux_diffusers_plan():
    return dtp.Plan.from_dict(model_class(FLUX)._tp_plan)


def _one_more_block(rank):
    return dict(model=lambda: tiny_model(FLUX, num_layers=2 + rank))


def _cases(rank) -> dict:
    """name -> how this rank builds its model, its plan, its mesh and options (rank 1 differs in one thing)."""
    bad_key = dtp.Plan.from_dict({"transformer_blocks.*.attn.to_nothing": "colwise"}, name="typo")
    return {
        "plan": dict(plan=dtp.load_plan("flux") if rank == 0 else _flux_diffusers_plan()),
        "blocks": _one_more_block(rank),
        "dtype": dict(model=lambda: tiny_model(FLUX).to(torch.bfloat16 if rank == 1 else torch.float32)),
        "cp_mode": dict(mesh=dict(tp=1, cp=2), cp_mode="ulysses" if rank == 0 else "ring"),
        "own_check_fails": dict(plan=dtp.load_plan("flux") if rank == 0 else bad_key),
    }


def _worker(rank, world_size):
    results = {name: _refused(**case) for name, case in _cases(rank).items()}
    results["agree"] = _agreeing()
    return results


def _refused(model=None, plan=None, mesh=None, cp_mode="ulysses") -> dict:
    """Call parallelize as the case says; the PlanError's message, the seconds it took, and the model untouched."""
    model = (model or (lambda: tiny_model(FLUX)))()
    mesh = dtp.make_mesh(**(mesh or dict(tp=2)))
    plan = plan or dtp.load_plan("flux")
    heads = model.transformer_blocks[0].attn.heads
    start = time.monotonic()
    try:
        dtp.parallelize(model, mesh, plan, cp_mode=cp_mode)
    except dtp.PlanError as error:
        message = str(error)
    else:
        message = None
    return dict(
        message=message,
        seconds=time.monotonic() - start,
        untouched=not any(isinstance(p, DTensor) for p in model.parameters())
        and model.transformer_blocks[0].attn.heads == heads,
    )


@torch.no_grad()
def _agreeing() -> dict:
    """Ranks that agree: parallelize costs one digest all_gather; the forward only the plan's collectives."""
    mesh = dtp.make_mesh(tp=2)
    model = tiny_model(FLUX)
    with CollectiveCounter() as setup:
        dtp.parallelize(model, mesh, dtp.load_plan("flux"))
    with CollectiveCounter(model) as forward:
        out = output_tensor(model(**tiny_inputs(FLUX)))
    ref = output_tensor(tiny_model(FLUX)(**tiny_inputs(FLUX)))
    implied = implied_collectives(dtp.engine.prepare(tiny_model(FLUX), mesh, dtp.load_plan("flux")).resolved, model)
    return dict(
        setup=[(r.op, r.bytes) for r in setup.records],
        forward={scope: forward.counts(scope) for scope in implied},
        implied=implied,
        forward_total=len(forward.records),
        relative=float((out - ref).abs().max() / ref.abs().max()),
    )


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 2, timeout_s=300)


EXPECTED = {
    "plan": r"key '[^']+' is \S+ on ranks \[\d\], absent on ranks \[\d\]",
    "blocks": r"module list 'transformer_blocks' is 2 elements on ranks \[0\], 3 elements on ranks \[1\]",
    "dtype": r"parameter dtypes is float32 x \d+ on ranks \[0\], bfloat16 x \d+ on ranks \[1\]",
    "cp_mode": r"option cp_mode is ulysses on ranks \[0\], ring on ranks \[1\]",
    "own_check_fails": r"(?s)ranks \[1\] failed the checks that ranks \[0\] passed.*to_nothing",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_rank_raises_naming_the_first_difference(results, case):
    """Rank 1 differs in one thing: both ranks raise the same PlanError naming it, within 10 s, model untouched."""
    outcomes = [rank_results[case] for rank_results in results]
    assert outcomes[0]["message"] is not None and outcomes[0]["message"] == outcomes[1]["message"], outcomes
    assert re.search(EXPECTED[case], outcomes[0]["message"]), outcomes[0]["message"]
    for outcome in outcomes:
        assert outcome["seconds"] < FAST_S, outcome
        assert outcome["untouched"], outcome


def test_a_different_plan_names_the_first_key_that_differs(results):
    """bundled flux vs diffusers' own _tp_plan: the message's first difference is a plan key."""
    first = results[0]["plan"]["message"].split("first: ", 1)[1]
    assert first.startswith("key '"), first


def test_agreeing_ranks_pay_one_small_collective_at_setup(results):
    """parallelize: exactly one all_gather of 2 x 32 bytes; the forward: only the plan's collectives; parity 1e-5."""
    for rank_results in results:
        agree = rank_results["agree"]
        assert agree["setup"] == [DIGEST_GATHER], agree["setup"]
        assert agree["forward"] == agree["implied"]
        assert agree["forward_total"] == sum(sum(c.values()) for c in agree["implied"].values())
        assert agree["relative"] <= 1e-5
