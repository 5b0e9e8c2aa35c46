"""Worker side of the issue-35 parity tests: the 2026 DiTs' bundled plans against one process, the OvisImage
suggest regression and its negative controls, in one spawned group per world size."""

from __future__ import annotations

import contextlib
import dataclasses
import os
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
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model

NEW_PLANS = ("flux3", "ltx2", "hunyuanvideo15", "wan_vace", "ovisimage", "chronoedit", "longcat_image", "bria")
# The others refuse cp in their plan header.
CP_PLANS = ("flux3", "wan_vace", "ovisimage", "chronoedit", "longcat_image", "bria")
BATCH = 2  # sample 1 has a padded prompt where the model takes a text mask

# Round 5: the default run keeps one new family per structural kind (ROUND5); the others repeat a covered kind and
# run only with DTP_FULL=1 (ROUND5_FULL; the tests mark them `full`, and the workers skip them too, which is where
# the time goes). *_CP: those whose plans have a cp section (the rest refuse cp in their header).
ROUND5 = ("wan_animate", "sana_video", "cogview3plus", "consisid")
# Helios: Wan blocks with history tokens (the Wan layout runs by default: wan_animate); FramePack: HunyuanVideo's
# blocks with history tokens (HunyuanVideo's own parity runs in test_coverage_parity*.py); Latte: PixArt's blocks,
# spatial and temporal.
ROUND5_FULL = ("helios", "hunyuanvideo_framepack", "latte")
ROUND5_CP = ("cogview3plus",)
ROUND5_CP_FULL: tuple[str, ...] = ()
# Round 8 (image models): Krea 2 runs by default (attention modules that keep `num_heads`, not `heads`; GQA with an
# output gate); the others repeat covered kinds (Hunyuan-DiT / DiT: PixArt's BasicTransformerBlock layout; FIBO:
# FLUX.1's; FIBO 2.0 / Ideogram 4: Z-Image's blocks; GLM-Image: CogView4's; ERNIE-Image: single-stream blocks; PRX:
# joint-key attention) and run with DTP_FULL=1.
# Round 8 (video models, MoE): NucleusMoE (a new kind: routed experts, `experts` style) runs by default in
# test_coverage_parity*.py like every plan not marked full, and here only its own cases (_moe_cases); the other video
# families repeat covered kinds and run with DTP_FULL=1. ROUND8_CP_FULL: those with a cp section.
ROUND8 = ("krea2",)
ROUND8_FULL = ("hunyuandit", "dit", "bria_fibo", "bria_fibo2", "glm_image", "ideogram4", "ernie_image", "prx")
ROUND8_FULL += (
    "minimax_h3",
    "allegro",
    "easyanimate",
    "motif_video",
    "joyimage_edit",
    "joyimage_edit_plus",
    "kandinsky5",
)
ROUND8_CP_FULL = ("hunyuandit", "dit", "bria_fibo", "bria_fibo2", "glm_image", "krea2", "ernie_image", "prx")
ROUND8_CP_FULL += ("minimax_h3", "easyanimate", "motif_video", "joyimage_edit_plus")
FULL = os.environ.get("DTP_FULL") == "1"


def tp_plans() -> tuple[str, ...]:
    """The plans this run checks at tp (the full ones only under DTP_FULL=1)."""
    return NEW_PLANS + ROUND5 + ROUND8 + (ROUND5_FULL + ROUND8_FULL if FULL else ())


def cp_plans() -> tuple[str, ...]:
    return CP_PLANS + ROUND5_CP + (ROUND5_CP_FULL + ROUND8_CP_FULL if FULL else ())


def params(default: tuple[str, ...], full: tuple[str, ...]) -> list:
    """pytest parameters: the default names, then the full ones marked `full`."""
    import pytest

    return [*default, *(pytest.param(name, marks=pytest.mark.full) for name in full)]


def run_tp(rank, world_size):
    """Every new plan at tp = world_size (cp=1)."""
    mesh = dtp.make_mesh(tp=world_size)
    return {name: _parity(name, mesh) for name in tp_plans()}


def run_two(rank, world_size):
    """tp=2: the plans, the OvisImage suggest regression and the negative controls; cp=2 (both modes) on the
    same two processes."""
    results = run_tp(rank, world_size)
    tp_mesh = dtp.make_mesh(tp=2)
    results["ovis/suggested"] = _suggested_ovis(tp_mesh)
    results["ovis/held_size"] = _held_size_outcomes(tp_mesh)
    results["ltx2/per_rank_qk_norm"] = _per_rank_qk_norm(tp_mesh)
    if FULL:
        results["prx/plain_colwise_qkv"] = _parity("prx", tp_mesh, _prx_plain_qkv_plan())
    results.update(_moe_cases(tp_mesh))
    cp_mesh = dtp.make_mesh(cp=2, tp=1)
    for name in cp_plans():
        for mode in ("ulysses", "ring"):
            results[f"{name}/cp/{mode}"] = _parity(name, cp_mesh, cp_mode=mode)
    return results


def _parity(name: str, mesh, plan=None, **options) -> float:
    cls = PLAN_CLASSES[name]
    plan = plan or dtp.load_plan(name)
    return forward_parity(partial(tiny_model, cls), tiny_inputs(cls, batch=BATCH), mesh, plan, **options).relative


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


def _prx_plain_qkv_plan():
    """Negative control: PRX's fused image q/k/v projection split as one colwise block instead of packed [1, 1, 1]
    (a plausible plan-writing slip): each rank's output then reshapes into a mix of q, k and v rows; it runs."""
    plan = dtp.load_plan("prx")
    key = "blocks.*.attention.img_qkv_proj"
    rules = tuple(Rule(key, Style("colwise")) if r.key == key else r for r in plan.rules)
    return dataclasses.replace(plan, rules=rules)


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


def _moe_cases(mesh) -> dict:
    """NucleusMoE with the released grouped-matmul experts (F.grouped_mm) instead of the tiny config's loop, and
    the negative control: the experts' partial outputs left un-reduced (each rank adds only its slices' share)."""
    cls = PLAN_CLASSES["nucleusmoe"]
    inputs, plan = tiny_inputs(cls, batch=BATCH), dtp.load_plan("nucleusmoe")
    grouped = forward_parity(partial(tiny_model, cls, use_grouped_mm=True), inputs, mesh, plan).relative

    def unreduced(module, args, output, *, mesh):
        for name in experts_style.PARAMS:
            module.__dict__.pop(name, None)
        return output

    with mock.patch.object(experts_style, "_reduce_output", unreduced):
        control = forward_parity(partial(tiny_model, cls), inputs, mesh, plan).relative
    return {"nucleusmoe/grouped_mm": grouped, "nucleusmoe/unreduced": control}
