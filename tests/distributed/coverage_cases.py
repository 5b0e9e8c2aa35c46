"""Worker side of the coverage parity tests (issue 10): every plan added for coverage, the collectives
each issues, loading through the shard-on-load path, and negative controls for the features they
need, in one spawned group per degree."""

import dataclasses

import torch

import dtp
from dtp.analysis.collectives import CollectiveCounter, implied_collectives
from dtp.runtime.norms import ShardedRMSNorm
from dtp.testing.scope import default_slot, full_run
from dtp.testing.tiny import PLAN_CLASSES, model_class, output_tensor, tiny_inputs, tiny_model

# Plans bundled before issue 10; their parity lives in test_tp_parity_2.py / _4.py.
EARLIER_PLANS = ("flux", "flux2", "qwenimage", "zimage")
COVERAGE_PLANS = tuple(sorted(set(PLAN_CLASSES) - set(EARLIER_PLANS)))
# One family per structural kind by default (dtp.testing.scope.KINDS), each at one tp degree: the kinds take tp=2 and
# tp=4 in turn (`default_slot`), so each kind's tp parity and collectives run once. The families that repeat a covered
# kind, and each kind's other degree, run with DTP_FULL=1 (marked `full`, and skipped by the workers, which is where
# the time goes).
TP_SLOTS = (2, 4)


def runs_at(name: str, tp: int) -> bool:
    """Whether the tp=`tp` group computes plan `name`'s family in this run."""
    return default_slot(name, TP_SLOTS.index(tp), len(TP_SLOTS))


def plan_params(tp: int) -> list:
    """pytest parameters over the coverage plans at tp=`tp`: those the group computes by default as they are, every
    other one marked `full`."""
    import pytest

    return [name if runs_at(name, tp) else pytest.param(name, marks=pytest.mark.full) for name in COVERAGE_PLANS]


BATCH = 2  # sample 1 has a padded prompt where the model takes a text mask (see dtp/families/shapes.py)


def run_cases(rank, world_size, tp, wan_checkpoint=None):
    mesh = dtp.make_mesh(tp=tp)
    results = {}
    for name in (name for name in COVERAGE_PLANS if runs_at(name, tp)):
        results[name], results[f"{name}/collectives"] = parity_and_collectives(mesh, name)
    if tp == TP_SLOTS[0] or full_run():  # the controls' mechanisms (norm all-reduce, flow check) at tp=4 too: full
        results["wan/per_rank_qk_norm"] = per_rank_qk_norm(mesh)
        results["ltx_video/rope_uncut"] = rope_uncut_error(mesh)
    if wan_checkpoint is not None:
        results["wan/loaded"] = loaded_parity(mesh, "wan", wan_checkpoint)
    return results


def _sharded(name: str, mesh, plan=None):
    return dtp.parallelize(tiny_model(PLAN_CLASSES[name]), mesh, plan or dtp.load_plan(name))


@torch.no_grad()
def _relative(name: str, model) -> float:
    cls = PLAN_CLASSES[name]
    ref = output_tensor(tiny_model(cls)(**tiny_inputs(cls, batch=BATCH)))
    out = output_tensor(model(**tiny_inputs(cls, batch=BATCH)))
    return float((out - ref).abs().max() / ref.abs().max())


@torch.no_grad()
def parity_and_collectives(mesh, name: str) -> tuple[float, dict]:
    """One sharded forward of plan `name` (one model sharded, not one per check): max |sharded - one process| /
    max |one process|, and this rank's collectives in it, in order and per block next to what the plan implies."""
    cls = PLAN_CLASSES[name]
    inputs = tiny_inputs(cls, batch=BATCH)
    ref = output_tensor(tiny_model(cls)(**inputs)).float()
    model, plan = tiny_model(cls), dtp.load_plan(name)
    implied = implied_collectives(dtp.resolve.resolve(plan, model), model)
    dtp.parallelize(model, mesh, plan)
    with CollectiveCounter(model) as counter:
        out = output_tensor(model(**inputs)).float()
    relative = float((out - ref).abs().max() / max(float(ref.abs().max()), 1e-30))
    return relative, {
        "sequence": [(c.op, c.bytes) for c in counter.records],
        "measured": {scope: dict(counter.counts(scope)) for scope in {r.scope for r in counter.records}},
        "implied": {scope: dict(c) for scope, c in implied.items()},
    }


def per_rank_qk_norm(mesh) -> float:
    """Negative control: Wan's QK-norm with its weight sliced per rank but normalized per rank (no
    all-reduce of the sum of squares): runs without error and must miss the parity tolerance."""
    model = _sharded("wan", mesh)
    for parent in model.modules():
        for child_name, child in list(parent.named_children()):
            if isinstance(child, ShardedRMSNorm):
                local = torch.nn.RMSNorm(child.width // mesh.size(), eps=child.eps)
                local.weight = torch.nn.Parameter(child.weight.to_local())
                setattr(parent, child_name, local)
    return _relative("wan", model)


def rope_uncut_error(mesh) -> str:
    """Negative control: LTX with its RoPE tables left whole (no shard_output rule) must fail loudly: since the
    flow check (resolve/flow.py), `prepare` refuses it with a PlanError before sharding; "ran" would be silent."""
    plan = dtp.load_plan("ltx_video")
    plan = dataclasses.replace(plan, rules=tuple(r for r in plan.rules if r.key != "rope"))
    try:
        _relative("ltx_video", _sharded("ltx_video", mesh, plan))
    except (RuntimeError, dtp.PlanError) as exc:
        return type(exc).__name__
    return "ran"


def save_checkpoint(name: str, root) -> str:
    """The tiny model of plan `name` saved by diffusers (safetensors), for the shard-on-load check."""
    path = str(root / name)
    tiny_model(PLAN_CLASSES[name]).save_pretrained(path, safe_serialization=True)
    return path


@torch.no_grad()
def loaded_parity(mesh, name: str, path: str) -> dict:
    """`dtp.from_pretrained` (norm weights read as this rank's slice) vs diffusers' own load, and the
    parameters that came back sharded."""
    cls = model_class(PLAN_CLASSES[name])
    inputs = tiny_inputs(PLAN_CLASSES[name], batch=BATCH)
    ref = output_tensor(cls.from_pretrained(path).eval()(**inputs))
    model = dtp.from_pretrained(cls, path, mesh, dtp.load_plan(name))
    out = output_tensor(model(**inputs))
    norms = [m for m in model.modules() if isinstance(m, ShardedRMSNorm)]
    return {
        "relative": float((out - ref).abs().max() / ref.abs().max()),
        "num_norms": len(norms),
        "norm_local_widths": sorted({m.weight.to_local().shape[0] for m in norms}),
    }
