"""The `cp` plan section: parsing (dtp YAML form and diffusers `_cp_plan`), resolve-time checks, candidates."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

import dtp
from dtp.families import released_overrides
from dtp.plan.cp import GATHERING_FORWARDS, GatherRule, SplitRule, cp_plan_from_mapping
from dtp.plan.io import _bundled_dir
from dtp.resolve import resolve, resolve_cp
from dtp.testing.scope import default_family
from dtp.testing.tiny import PLAN_CLASSES, model_class, tiny_model

FLUX, QWEN, ZIMAGE = "FluxTransformer2DModel", "QwenImageTransformer2DModel", "ZImageTransformer2DModel"
CP_PLANS = sorted(
    name for name in PLAN_CLASSES if dtp.load_plan(name).cp is not None and dtp.load_plan(name).cp.refused is None
)
NO_CP_REASON = "# No `cp` section:"  # the header line a plan without one must carry


def test_plans_without_cp_say_why():
    """A bundled plan either has a `cp` section or a header line saying why not (e.g. the processor
    calls F.scaled_dot_product_attention directly, or CP is not verified for it yet)."""
    assert {"flux", "flux2", "qwenimage", "zimage"} <= set(CP_PLANS)
    for name in sorted(set(PLAN_CLASSES) - set(CP_PLANS)):
        cp = dtp.load_plan(name).cp
        assert (cp is not None and cp.refused) or NO_CP_REASON in (_bundled_dir() / f"{name}.yaml").read_text(), name


@pytest.mark.parametrize("name", CP_PLANS)
def test_bundled_plans_have_cp_sections_that_resolve(name):
    """Every bundled plan with a `cp` section: its keys and input names fit the tiny model."""
    plan = dtp.load_plan(name)
    kept = [rule.gather for rule in plan.cp.keep if rule.gather] if plan.cp is not None else []  # FramePack's
    cuts = plan.cp is not None and (plan.cp.splits or plan.cp.forward)  # Helios: its forward cuts (`cp.forward`)
    gathering = plan.cp is not None and plan.cp.forward is not None and plan.cp.forward.name in GATHERING_FORWARDS
    assert cuts and (plan.cp.gathers or kept or plan.cp.grid or gathering)  # Kandinsky: grid; Cosmos 3: its forward
    model = tiny_model(PLAN_CLASSES[name])
    cp_resolved = resolve_cp(resolve(plan, model), model)
    assert cp_resolved.attention  # every attention module is pluggable
    assert {path for path, _ in cp_resolved.gathers} or kept or cp_resolved.grids or gathering


def test_dtp_form_parses_to_typed_rules():
    plan = cp_plan_from_mapping(
        {
            "split": {
                "": {"hidden_states": {"dim": 1, "expected_dims": 3}},
                "pos_embed": {0: {"dim": 0, "output": True}},
            },
            "gather": {"proj_out": {"dim": 1}},
        },
        "t",
    )
    assert plan.splits == (SplitRule("", "hidden_states", 1, 3, False), SplitRule("pos_embed", 0, 0, None, True))
    assert plan.gathers == (GatherRule("proj_out", 1, None),)


# The bundled Qwen-Image plan cuts the image tokens at the model's input, before `img_in`, where diffusers cuts them
# at the first block: the whole embedded image no longer lives through block 0 (cp=8 at 1024²: 1.72 -> 1.24 x ideal).
QWEN_MOVED = {
    SplitRule("transformer_blocks.0", "hidden_states", 1, 3, False): SplitRule("", "hidden_states", 1, 3, False),
}


@pytest.mark.parametrize("cls", ["FluxTransformer2DModel", "Flux2Transformer2DModel", QWEN])
def test_diffusers_cp_plan_imports_like_the_bundled_plan(cls):
    """A diffusers `_cp_plan` reads into the same rules; for Flux/Flux2 it is the bundled plan, for Qwen-Image the
    bundled plan with the image split moved earlier (`QWEN_MOVED`)."""
    klass = model_class(cls)
    imported = cp_plan_from_mapping(klass._cp_plan, cls)
    bundled = dtp.load_plan({v: k for k, v in PLAN_CLASSES.items()}[cls]).cp
    moved = QWEN_MOVED if cls == QWEN else {}
    # dtp's own additions (any sequence length: `pad` on the splits, `trim` on the gather) are not in diffusers' plan
    plain_splits = {dataclasses.replace(rule, pad=None) for rule in bundled.splits}
    assert {moved.get(rule, rule) for rule in imported.splits} == plain_splits
    assert set(imported.gathers) == {dataclasses.replace(rule, trim=None) for rule in bundled.gathers}


def test_from_dict_with_tp_and_diffusers_cp():
    klass = model_class(FLUX)
    plan = dtp.Plan.from_dict({"tp": klass._tp_plan, "cp": klass._cp_plan})
    assert plan.cp is not None and plan.cp.gathers == (GatherRule("proj_out", 1, 3),)


def test_diffusers_objects_matched_by_class_name():
    plan = cp_plan_from_mapping(
        {"": {"x": ContextParallelInput(split_dim=1)}, "out": ContextParallelOutput(gather_dim=1)}, "t"
    )
    assert plan.splits == (SplitRule("", "x", 1, None, False),)


@pytest.mark.parametrize(
    "data, match",
    [
        ({"split": {"": {"x": {"dim": 1}}}}, "gathers nothing"),
        ({"split": {}, "gather": {"proj_out": {"dim": 1}}}, "splits nothing"),
        ({"split": {"": {"x": {"dim": "1"}}}, "gather": {"o": {"dim": 1}}}, "`dim` must be an integer"),
        ({"split": {"": {0: {"dim": 1}}}, "gather": {"o": {"dim": 1}}}, "integer index"),
        ({"split": {"": {"x": {"dim": 1, "output": True}}}, "gather": {"o": {"dim": 1}}}, "integer index"),
        ({"split": {"": {"x": {"dim": 1, "bogus": 2}}}, "gather": {"o": {"dim": 1}}}, "expected"),
        ({"split": {"a.*.*": {"x": {"dim": 1}}}, "gather": {"o": {"dim": 1}}}, "at most one"),
        ({"split": {"b.*": {"height": {"count": 1}}}, "gather": {"o": {"dim": 1}}}, "`{count: true}` alone"),
        ({"split": {"b.*": {"height": {"count": True, "dim": 0}}}, "gather": {"o": {"dim": 1}}}, "alone"),
        ({"split": {"b.*": {"x": {"dim": 1}}}, "gather": {"o": {"dim": 1}}, "halo": {"c": {"rows": 1}}}, "row dim"),
        ({"split": {"b.0": {"x": {"dim": 1}}}, "grid": {"o": {"input": "x"}}}, "GridRule"),
        ({"split": {"b.0": {"x": {"dim": 1}}}, "grid": {"o": {"input": "x", "tokens": "b.*"}}}, "no `\\*`"),
        ({"split": {"b.0": {"x": {"dim": 1}}}, "grid": {"o": {"input": "x", "tokens": "b.-1", "trim": "x"}}}, "trim"),
        ({"split": {"b.0": {"x": {"dim": 1, "per_frame": "t"}}}, "gather": {"o": {"dim": 1}}}, "plain input split"),
        ({"split": {"b.0": {"x": {"dim": 1, "embed": "e", "strided": True}}}, "gather": {"o": {"dim": 1}}}, "plain"),
    ],
)
def test_malformed_cp_sections_are_plan_errors(data, match):
    with pytest.raises(dtp.PlanError, match=match):
        cp_plan_from_mapping(data, "t")


def _plan_with_cp(name: str, cp: dict) -> dtp.Plan:
    base = dtp.load_plan(name)
    return dtp.Plan(
        rules=base.rules, models=base.models, attention=base.attention, name="t", cp=cp_plan_from_mapping(cp, "t")
    )


def test_unknown_input_name_is_refused_at_resolve():
    model = tiny_model(FLUX)
    plan = _plan_with_cp("flux", {"split": {"": {"hidden_state": {"dim": 1}}}, "gather": {"proj_out": {"dim": 1}}})
    with pytest.raises(dtp.PlanError, match="no forward\\(\\) parameter 'hidden_state'"):
        resolve_cp(resolve(plan, model), model)


def test_missing_module_is_refused_at_resolve():
    model = tiny_model(FLUX)
    plan = _plan_with_cp("flux", {"split": {"": {"hidden_states": {"dim": 1}}}, "gather": {"proj_outt": {"dim": 1}}})
    with pytest.raises(dtp.PlanError, match="proj_outt"):
        resolve_cp(resolve(plan, model), model)


def test_plan_without_cp_section_is_refused_for_cp_above_one():
    model = tiny_model(FLUX)
    plan = dtp.Plan(rules=dtp.load_plan("flux").rules, name="t")
    with pytest.raises(dtp.PlanError, match="no `cp` section"):
        resolve_cp(resolve(plan, model), model)


def test_ulysses_head_rule_names_module_and_numbers():
    """Flux tiny has 4 heads: at tp=2 each rank has 2, which cp=4 does not divide; ring has no such rule."""
    model = tiny_model(FLUX)
    cp_resolved = resolve_cp(resolve(dtp.load_plan("flux"), model), model)
    with pytest.raises(dtp.PlanError, match=r"'transformer_blocks.0.attn' has 4 heads, 2 per rank at tp=2.*cp=4"):
        cp_resolved.check(2, 4, "ulysses")
    cp_resolved.check(2, 4, "ring")
    cp_resolved.check(2, 2, "ulysses")
    with pytest.raises(dtp.PlanError, match="cp_mode must be one of"):
        cp_resolved.check(1, 2, "ringg")


def test_tp_candidates_are_cp_aware():
    model = tiny_model(FLUX)  # 4 heads, tp candidates [1, 2, 4]
    assert dtp.tp_candidates(model) == [1, 2, 4]
    assert dtp.tp_candidates(model, cp=2) == [1, 2]  # Ulysses: (4 / tp) % 2 == 0
    assert dtp.tp_candidates(model, cp=4) == [1]
    assert dtp.tp_candidates(model, cp=4, cp_mode="ring") == [1, 2, 4]
    assert dtp.tp_candidates(model, cp=3) == []


def test_zimage_heads_limit_ulysses_at_full_size():
    """Z-Image 6B: 30 heads -> Ulysses at cp=2 keeps tp=1 (30 per rank, even), drops tp=2 (15 per rank)."""
    with torch.device("meta"):
        model = model_class(ZIMAGE)(
            dim=3840,
            n_heads=30,
            n_kv_heads=30,
            n_layers=1,
            n_refiner_layers=1,
            cap_feat_dim=64,
            axes_dims=[32, 48, 48],
            axes_lens=[1024, 512, 512],
        )
    base = dtp.tp_candidates(model)
    assert base[:2] == [1, 2]
    assert dtp.tp_candidates(model, cp=2) == [tp for tp in base if (30 // tp) % 2 == 0]
    assert 2 not in dtp.tp_candidates(model, cp=2)
    assert dtp.tp_candidates(model, cp=2, cp_mode="ring") == base


# One family per structural kind by default (dtp.testing.scope.KINDS), every cp plan with DTP_FULL=1: each full-size
# resolution is a further case of the kind (the cp section's rules against the released config).
@pytest.mark.parametrize(
    "name", [n if default_family(n) else pytest.param(n, marks=pytest.mark.full) for n in CP_PLANS]
)
def test_full_size_models_resolve_cp_on_meta(name):
    """Default (full-size) configs on the meta device: the cp section fits, and Ulysses candidates follow
    (heads / tp) % cp == 0 with the model's real head count (linear attention, Sana's: no head rule, any cp)."""
    with torch.device("meta"):  # the released config (HiDream's class defaults cannot be built)
        model = model_class(PLAN_CLASSES[name])(**released_overrides(PLAN_CLASSES[name]))
    plan = dtp.load_plan(name)
    cp_resolved = resolve_cp(resolve(plan, model), model)
    heads = {spec.heads for spec in cp_resolved.attention if not spec.linear}
    assert len(heads) <= 1 and (heads or all(spec.linear for spec in cp_resolved.attention))
    h = heads.pop() if heads else 0  # 0: every CP module is linear attention, so every tp stays at any cp
    base = dtp.tp_candidates(model, plan)
    for cp in (2, 4):
        assert dtp.tp_candidates(model, plan, cp=cp) == [tp for tp in base if (h // tp) % cp == 0]
        ring = [] if plan.cp.ring_refused else base  # Qwen-Image 2.1: Ulysses only (block-causal mask)
        assert dtp.tp_candidates(model, plan, cp=cp, cp_mode="ring") == ring


def test_grid_and_embed_are_checked_at_resolve():
    """Kandinsky 5's `grid` naming an input its output layer lacks, and an `embed` naming a module that is not a
    patch embedding dtp computes per rank: PlanErrors before anything is hooked."""
    model = tiny_model(PLAN_CLASSES["kandinsky5"])
    split = {"visual_transformer_blocks.0": {"visual_embed": {"dim": 1, "expected_dims": 3}}}
    grid = {"out_layer": {"input": "hidden_states", "tokens": "visual_transformer_blocks.-1"}}
    with pytest.raises(dtp.PlanError, match="no forward\\(\\) input 'hidden_states'"):
        resolve_cp(resolve(_plan_with_cp("kandinsky5", {"split": split, "grid": grid}), model), model)
    split["visual_transformer_blocks.0"]["visual_embed"]["embed"] = "time_embeddings"
    grid["out_layer"]["input"] = "visual_embed"
    with pytest.raises(dtp.PlanError, match="not a patch embedding"):
        resolve_cp(resolve(_plan_with_cp("kandinsky5", {"split": split, "grid": grid}), model), model)
