"""CP for the families whose forward makes a choice over the whole sequence (issue 45): gloo parity.

ONE 4-process group. Each family tiny with perturbed weights, batch 2, against one process: max |out - ref| <= 1e-5 *
max |ref| at (cp=2, tp=2) (ranks {0, 1} and {2, 3} each a (cp=2, tp=1) submesh for cp=2 alone), Ulysses and ring;
one case per family runs by default, the others with DTP_FULL=1.
- Nucleus-Image (expert-choice routing: every expert takes the top-C tokens of the whole image sequence): the choice
  made from the gathered router scores (`runtime/cp/expert_choice.py`), counted once per MoE layer and call. 16 image
  tokens, capacity 8 per expert; 7 text tokens (padded at cp=2). Control: the plan without `gathered` (each rank
  routes among its own tokens with its own capacity: a top-k made per rank).
- Kandinsky 6 SR (NABLA's block mask from 64-token block means of the whole sequence): 2 frames of 8 x 16 tokens,
  4 blocks. Eager flex (CPU) ignores a BlockMask's sparsity, so reference and CP runs are inside
  `dtp.testing.flex.sparse_flex()` (eager flex then attends through the mask, as the compiled kernel does; the mask
  changes the output by 8e-2). Control: ring with every rank's "key means" its own (a mask built from local means).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import dtp
import dtp.runtime.cp.expert_choice as expert_choice
import dtp.runtime.cp.nabla as nabla
from dtp.testing.flex import sparse_flex
from dtp.testing.launch import spawn
from dtp.testing.perturb import perturb
from dtp.testing.scope import full_run
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

TOL = 1e-5
FAMILIES = ("nucleusmoe", "kandinsky6_sr")
MESHES = (("tp", "ulysses"), ("tp", "ring"), ("cp", "ulysses"), ("cp", "ring"))  # "tp": (cp=2, tp=2); "cp": cp=2
DEFAULT = {"nucleusmoe": ("tp", "ulysses"), "kandinsky6_sr": ("tp", "ring")}  # the rest: DTP_FULL=1
TXT_TOKENS = {"nucleusmoe": 7}


def _model(name: str):
    return perturb(tiny_model(PLAN_CLASSES[name]), seed=7)


def _inputs(name: str) -> dict:
    return tiny_inputs(PLAN_CLASSES[name], batch=2, txt_tokens=TXT_TOKENS.get(name, 8))


class _Counter:
    """Counts calls of `owner.name` (a function or method), to prove the CP route really ran."""

    def __init__(self, owner, name):
        self.owner, self.name, self.calls = owner, name, 0
        self.original = getattr(owner, name)

    def __enter__(self):
        def counted(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(self.owner, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.original)


@torch.no_grad()
def _rel(model, inputs: dict, ref: torch.Tensor) -> float:
    out = model(**inputs)[0].float()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    return float((out - ref).abs().max() / ref.abs().max())


@torch.no_grad()
def _case(name: str, mesh, mode: str, plan=None) -> dict:
    """`name` at `mesh` / `mode` against one process: rel, and how often each CP route ran in the call."""
    inputs = _inputs(name)
    with sparse_flex():
        ref = _model(name)(**inputs)[0].float()
        model = dtp.parallelize(_model(name), mesh, plan or dtp.load_plan(name), cp_mode=mode)
        with (
            _Counter(expert_choice.ExpertChoiceCp, "__call__") as routed,
            _Counter(nabla, "_whole") as whole,
            _Counter(nabla, "masked_block") as steps,
        ):
            rel = _rel(model, inputs, ref)
    return dict(rel=rel, routed=routed.calls, whole=whole.calls, steps=steps.calls)


def _local_means(mesh) -> dict:
    """Kandinsky 6 SR at ring with each rank's key means its own, repeated (a mask from local means)."""
    gather = nabla.all_gather_along
    nabla.all_gather_along = lambda x, group, dim: torch.cat([x] * group.size(), dim=dim)
    try:
        return _case("kandinsky6_sr", mesh, "ring")
    finally:
        nabla.all_gather_along = gather


def _per_rank_topk(mesh) -> dict:
    """Nucleus-Image at ring without `cp.gathered`: each rank's MoE layers route among its own tokens."""
    plan = dtp.load_plan("nucleusmoe")
    return _case("nucleusmoe", mesh, "ring", dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, gathered=())))


def _all(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    pairs = init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("pair", "cp", "tp"))["cp", "tp"]
    meshes = {"cp": pairs, "tp": dtp.make_mesh(cp=2, tp=2)}
    results = {}
    for name in FAMILIES:
        for axis, mode in MESHES if full_run() else (DEFAULT[name],):
            results[name, axis, mode] = _case(name, meshes[axis], mode)
    results["nucleusmoe", "control"] = _per_rank_topk(meshes["tp"])
    results["kandinsky6_sr", "control"] = _local_means(meshes["tp"])
    return results


@pytest.fixture(scope="module")
def four():
    return spawn(_all, 4)


def _cases():
    return [
        pytest.param(name, axis, mode, marks=() if DEFAULT[name] == (axis, mode) else pytest.mark.full)
        for name in FAMILIES
        for axis, mode in MESHES
    ]


@pytest.mark.parametrize("name,axis,mode", _cases())
def test_parity(four, name, axis, mode):
    """(cp=2, tp=2) or cp=2, Ulysses or ring: max |out - ref| <= 1e-5 * max |ref| (measured 0..7.9e-7), each route
    run: Nucleus-Image's one MoE layer once a call; Kandinsky 6 SR's two attentions once each under Ulysses, in
    cp = 2 ring steps each under ring."""
    for results in four:
        r = results[name, axis, mode]
        assert r["rel"] <= TOL, (name, axis, mode, r)
        if name == "nucleusmoe":
            assert r["routed"] == 1, r
        else:
            assert (r["whole"], r["steps"]) == ((2, 0) if mode == "ulysses" else (0, 4)), r


def test_nucleusmoe_per_rank_topk_fails(four):
    """Negative control: each rank's experts take the top-C of its own 8 tokens (capacity 4): far off."""
    for results in four:
        assert results["nucleusmoe", "control"]["rel"] > 1e-2, results["nucleusmoe", "control"]


def test_kandinsky6_sr_mask_from_local_means_fails(four):
    """Negative control: ring with NABLA's rows built from the rank's own key-block means only: far off."""
    for results in four:
        assert results["kandinsky6_sr", "control"]["rel"] > 1e-2, results["kandinsky6_sr", "control"]


def test_report(four):
    """Prints rank 0's figures (`pytest -s`), the numbers docs/cp.md quotes."""
    for key, r in sorted(four[0].items(), key=str):
        print(key, f"{r['rel']:.2e}")
