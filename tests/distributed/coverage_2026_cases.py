"""Worker side of the issue-35 parity tests: the 2026 DiTs' cp sections against one process, the OvisImage suggest
regression and its negative controls, in one spawned group."""

from __future__ import annotations

import contextlib
import dataclasses
from functools import partial
from unittest import mock

import torch

import dtp
from dtp.analysis.suggest import suggest_plan
from dtp.plan import Rule, Style
from dtp.resolve import clear_caches
from dtp.runtime.norms import ShardedRMSNorm
from dtp.styles import experts as experts_style
from dtp.testing.parity import forward_parity
from dtp.testing.scope import default_family, family_runs, full_run
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model

# The 2026 families whose plans have a cp section (the others refuse cp in their header). Their tp parity at tp=2 and
# tp=4 is test_coverage_parity*.py's (every bundled plan beyond the first four, with its collectives).
CP_PLANS = ("flux3", "wan_vace", "ovisimage", "chronoedit", "longcat_image", "bria")
ROUND5_CP = ("cogview3plus",)
# Round 8's families with a cp section: each runs by default only if it stands for a kind (KINDS: Krea 2).
ROUND8_CP = ("hunyuandit", "dit", "bria_fibo", "bria_fibo2", "glm_image", "krea2", "ernie_image", "prx")
ROUND8_CP += ("minimax_h3", "easyanimate", "motif_video", "joyimage_edit_plus")
BATCH = 2  # sample 1 has a padded prompt where the model takes a text mask
FULL = full_run()


def cp_plans() -> tuple[str, ...]:
    """The plans this run checks at cp=2: one family per structural kind (dtp.testing.scope.KINDS), all with
    DTP_FULL=1."""
    return tuple(name for name in CP_PLANS + ROUND5_CP + ROUND8_CP if family_runs(name))


def params(names: tuple[str, ...], more: tuple[str, ...] = ()) -> list:
    """pytest parameters over families: a kind's family as it is, every other one marked `full`."""
    import pytest

    return [name if default_family(name) else pytest.param(name, marks=pytest.mark.full) for name in (*names, *more)]


def run_two(rank, world_size):
    """tp=2: the OvisImage suggest regression and the negative controls; cp=2 (both modes) on the same two
    processes."""
    results = {}
    tp_mesh = dtp.make_mesh(tp=2)
    results["ovis/suggested"] = _suggested_ovis(tp_mesh)
    results["ovis/held_size"] = _held_size_outcomes(tp_mesh)
    if FULL:
        results["prx/plain_colwise_qkv"] = _parity("prx", tp_mesh, _prx_plain_qkv_plan())
        results["kandinsky6/audio"] = _second_output_parity("kandinsky6", tp_mesh)
    results.update(_moe_cases(tp_mesh))
    results["ltx2/per_rank_qk_norm"] = _per_rank_qk_norm(tp_mesh)
    cp_mesh = dtp.make_mesh(cp=2, tp=1)
    for name in cp_plans():
        for mode in ("ulysses", "ring"):
            results[f"{name}/cp/{mode}"] = _parity(name, cp_mesh, cp_mode=mode)
    return results


def _parity(name: str, mesh, plan=None, **options) -> float:
    cls = PLAN_CLASSES[name]
    plan = plan or dtp.load_plan(name)
    return forward_parity(partial(tiny_model, cls), tiny_inputs(cls, batch=BATCH), mesh, plan, **options).relative


@torch.no_grad()
def _second_output_parity(name: str, mesh) -> float:
    """Relative error of the model's second output (Kandinsky 6's audio velocity), which the family-wide parity
    tests do not compare (they take the first): the last fused block's audio attentions reach only this one."""
    cls = PLAN_CLASSES[name]
    ref = tiny_model(cls)(**tiny_inputs(cls, batch=BATCH))[1]
    out = dtp.parallelize(tiny_model(cls), mesh, dtp.load_plan(name))(**tiny_inputs(cls, batch=BATCH))[1]
    return float((out - ref).abs().max() / ref.abs().max())


def _suggested_ovis(mesh) -> float:
    """OvisImage without its bundled plan: dtp.suggest_plan, then parallelize; relative error of one forward."""
    cls = "OvisImageTransformer2DModel"
    inputs = tiny_inputs(cls, batch=BATCH)
    plan = suggest_plan(tiny_model(cls), inputs, tp=2)
    return forward_parity(partial(tiny_model, cls), inputs, mesh, plan).relative


def _ovis_sharded_mlp_plan():
    """The OvisImage plan with the single blocks' proj_mlp packed_colwise [1, 1] -> proj_out packed_rowwise
    [1, 4] and their attention sharded: what a plan writer (or the old suggest) would write."""
    plan = dtp.load_plan("ovisimage")
    rules = [r for r in plan.rules if r.key != "single_transformer_blocks.*.proj_mlp"]
    prefix = "single_transformer_blocks.*."
    rules += [Rule(f"{prefix}attn.to_{p}", Style("colwise")) for p in "qkv"] + [
        Rule(f"{prefix}proj_mlp", Style("packed_colwise"), blocks=(1, 1)),
        Rule(f"{prefix}proj_out", Style("packed_rowwise"), blocks=(1, 4)),
    ]
    return dataclasses.replace(plan, rules=tuple(rules), attention=(*plan.attention, f"{prefix}attn"))


def _held_size_outcomes(mesh) -> dict:
    """ "checked": the held-size check refuses the plan before sharding (naming mlp_hidden_dim). "flow only": with
    it switched off, the meta forward of the flow check still refuses it, because OvisImage now has example inputs
    (its family). Negative control, "unchecked": both off, as for a class without a family (the report of issue
    35): the plan passes prepare and the forward crashes inside the block's torch.split."""
    off = lambda *a: None  # noqa: E731
    cases = {
        "checked": [],
        "flow only": [("dtp.resolve.exactness.exact.check_held_sizes", off)],
        "unchecked": [
            ("dtp.resolve.exactness.exact.check_held_sizes", off),
            ("dtp.resolve.exactness.flow.example_inputs", off),
        ],
    }
    outcomes = {}
    for label, patches in cases.items():
        clear_caches()  # "flow only" would otherwise be answered by the cached refusal of this plan
        with contextlib.ExitStack() as stack:
            for target, replacement in patches:
                stack.enter_context(mock.patch(target, replacement))
            outcomes[label] = _outcome(mesh)
    return outcomes


def _outcome(mesh) -> str:
    try:
        _parity("ovisimage", mesh, _ovis_sharded_mlp_plan())
    except dtp.PlanError as exc:
        return "PlanError: held size" if "mlp_hidden_dim" in str(exc) else "PlanError: flow"
    except RuntimeError:
        return "crash"
    return "ran"


@torch.no_grad()
def _per_rank_qk_norm(mesh) -> float:
    """Negative control: LTX-2 with its QK-norms across heads normalized per rank (sliced weight, no all-reduce
    of the sum of squares) runs and must miss parity."""
    cls = PLAN_CLASSES["ltx2"]
    model = dtp.parallelize(tiny_model(cls), mesh, dtp.load_plan("ltx2"))
    for parent in model.modules():
        for child_name, child in list(parent.named_children()):
            if isinstance(child, ShardedRMSNorm):
                local = torch.nn.RMSNorm(child.width // mesh.size(), eps=child.eps)
                local.weight = None if child.weight is None else torch.nn.Parameter(child.weight.to_local())
                setattr(parent, child_name, local)
    ref = output_tensor(tiny_model(cls)(**tiny_inputs(cls, batch=BATCH)))
    out = output_tensor(model(**tiny_inputs(cls, batch=BATCH)))
    return float((out - ref).abs().max() / ref.abs().max())


def _prx_plain_qkv_plan():
    """Negative control: PRX's fused image q/k/v projection split as one colwise block instead of packed [1, 1, 1]
    (a plausible plan-writing slip): each rank's output then reshapes into a mix of q, k and v rows; it runs."""
    plan = dtp.load_plan("prx")
    key = "blocks.*.attention.img_qkv_proj"
    rules = tuple(Rule(key, Style("colwise")) if r.key == key else r for r in plan.rules)
    return dataclasses.replace(plan, rules=rules)


def _moe_cases(mesh) -> dict:
    """NucleusMoE with the released grouped-matmul experts (F.grouped_mm) instead of the tiny config's loop, and
    the negative control: the experts' partial outputs left un-reduced (each rank adds only its slices' share)."""
    cls = PLAN_CLASSES["nucleusmoe"]
    inputs, plan = tiny_inputs(cls, batch=BATCH), dtp.load_plan("nucleusmoe")
    grouped = forward_parity(partial(tiny_model, cls, use_grouped_mm=True), inputs, mesh, plan).relative

    def unreduced(module, args, output, *, tp):
        for name in experts_style.PARAMS:
            module.__dict__.pop(name, None)
        return output

    with mock.patch.object(experts_style, "_reduce_output", unreduced):
        control = forward_parity(partial(tiny_model, cls), inputs, mesh, plan).relative
    return {"nucleusmoe/grouped_mm": grouped, "nucleusmoe/unreduced": control}
