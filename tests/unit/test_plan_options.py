"""Plans follow a class's config options (issue 45): a rule marked `optional` may match nothing when the config
leaves its module out (None, or never created), and a name no code of the model creates is still a PlanError."""

from __future__ import annotations

import dataclasses

import pytest

import dtp
from dtp.analysis.fakepg import meta_model
from dtp.families import FAMILIES
from dtp.resolve import resolve
from dtp.resolve.binding.globs import declared

ANIMATE, FRAMEPACK, CONSISID, WAN = (
    "WanAnimateTransformer3DModel",
    "HunyuanVideoFramepackTransformer3DModel",
    "ConsisIDTransformer3DModel",
    "WanTransformer3DModel",
)


def _model(class_name: str, **overrides):
    return meta_model(class_name, {**FAMILIES[class_name].tiny, **overrides})


def _paths(resolved) -> set[str]:
    return {spec.path for spec in resolved.linears} | {spec.path for spec in resolved.norms}


def _renamed(plan, old: str, new: str):
    rules = tuple(dataclasses.replace(r, key=r.key.replace(old, new)) for r in plan.rules)
    return dataclasses.replace(plan, rules=rules)


def test_wan_animate_plan_follows_added_kv_proj_dim():
    """With the option: add_k_proj / add_v_proj / norm_added_k sharded in every block; without it (add_k_proj None,
    norm_added_k never created) the same plan resolves and plans none of them."""
    plan = dtp.load_plan("wan_animate")
    with_branch = _paths(resolve(plan, _model(ANIMATE)))
    assert {"blocks.0.attn2.add_k_proj", "blocks.0.attn2.norm_added_k"} <= with_branch
    without = _paths(resolve(plan, _model(ANIMATE, added_kv_proj_dim=None)))
    assert not {p for p in without if ".add_" in p or "norm_added" in p}
    assert with_branch - without == {p for p in with_branch if ".add_" in p or "norm_added" in p}


def test_wan_plan_follows_the_i2v_image_branch():
    """Wan 2.1 I2V (added_kv_proj_dim set): the image branch is sharded with its norm across heads, where the plan
    used to be refused for the unplanned norm_added_k."""
    paths = _paths(resolve(dtp.load_plan("wan"), _model(WAN, image_dim=16, added_kv_proj_dim=64)))
    assert {"blocks.0.attn2.add_k_proj", "blocks.0.attn2.add_v_proj", "blocks.0.attn2.norm_added_k"} <= paths


def test_optional_key_without_a_glob_matches_nothing_when_none():
    """FramePack without has_image_proj: `image_projection` is None, its two optional rules match nothing."""
    paths = _paths(resolve(dtp.load_plan("hunyuanvideo_framepack"), _model(FRAMEPACK, has_image_proj=False)))
    assert not {p for p in paths if p.startswith("image_projection")}


def test_attention_glob_of_optional_rules_is_optional():
    """ConsisID without is_train_face: `perceiver_cross_attention` is never created; its rules and its attention
    glob (whose rules are all optional) match nothing."""
    resolved = resolve(dtp.load_plan("consisid"), _model(CONSISID, is_train_face=False))
    assert not [spec for spec in resolved.attention if spec.path.startswith("perceiver")]


@pytest.mark.parametrize(
    "plan, class_name, old, new, overrides",
    [
        ("wan_animate", ANIMATE, "attn2.norm_added_k", "attn2.norm_addedk", {"added_kv_proj_dim": None}),
        ("wan_animate", ANIMATE, "attn2.norm_added_k", "attn2.norm_addedk", {}),
        ("hunyuanvideo_framepack", FRAMEPACK, "image_projection.", "image_projektion.", {"has_image_proj": False}),
        ("consisid", CONSISID, "perceiver_cross_attention.*.to_q", "perceiver_cross_attention.*.to_qq", {}),
        ("consisid", CONSISID, "perceiver_cross_attention.", "perceiver_crossattention.", {"is_train_face": False}),
    ],
)
def test_negative_control_a_typo_in_an_optional_rule_is_still_refused(plan, class_name, old, new, overrides):
    """The same optional rules with one name misspelled: refused whether or not the config has the module."""
    with pytest.raises(dtp.PlanError, match="no code of .* creates a module"):
        resolve(_renamed(dtp.load_plan(plan), old, new), _model(class_name, **overrides))


def test_declared_reads_the_code_that_creates_modules():
    model = _model(ANIMATE, added_kv_proj_dim=None)
    attn2 = model.blocks[0].attn2
    assert declared("norm_added_k", attn2, model) and not declared("norm_addedk", attn2, model)
