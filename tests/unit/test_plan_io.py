"""Reading plans: YAML, dtp dicts, diffusers `_tp_plan` with packed markers, bundled plans."""

import pytest
from diffusers import Flux2Transformer2DModel, FluxTransformer2DModel, QwenImageTransformer2DModel

import dtp
from dtp.plan import Style
from dtp.plan.io import bundled_plan_names
from dtp.testing.tiny import PLAN_CLASSES, tiny_model


def test_bundled_plans_are_found_by_name():
    """Each family names its plan (dtp/families/); that plan exists and lists the family's class in `models:`
    (two sources written separately: a family pointing at the wrong plan fails here)."""
    assert set(bundled_plan_names()) >= {"flux", "flux2", "qwenimage", "zimage"}
    for name, cls in PLAN_CLASSES.items():
        assert name in bundled_plan_names(), name
        assert cls in dtp.load_plan(name).models, (name, cls)


def test_every_bundled_dit_plan_has_a_family():
    """A diffusers DiT plan without a family would have no tiny config, inputs or released overrides."""
    from dtp.families import FAMILIES

    for name in bundled_plan_names():
        dit = [c for c in dtp.load_plan(name).models if "Transformer" in c and c.endswith("Model")]
        assert all(c in FAMILIES for c in dit), (name, dit)


def test_yaml_file_with_packed_blocks(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "models: [Foo]\nattention: ['blocks.*.attn']\ntp:\n"
        "  blocks.*.attn.to_q: colwise\n"
        "  blocks.*.ff.linear_in: {style: packed_colwise, blocks: [1, 1]}\n"
        "  blocks.*.proj_out: packed_rowwise\n"
    )
    plan = dtp.load_plan(path)
    assert plan.models == ("Foo",) and plan.attention == ("blocks.*.attn",)
    assert [(r.key, r.style, r.blocks) for r in plan.rules] == [
        ("blocks.*.attn.to_q", Style.COLWISE, None),
        ("blocks.*.ff.linear_in", Style.PACKED_COLWISE, (1, 1)),
        ("blocks.*.proj_out", Style.PACKED_ROWWISE, None),
    ]


@pytest.mark.parametrize("cls", [FluxTransformer2DModel, Flux2Transformer2DModel, QwenImageTransformer2DModel])
def test_diffusers_tp_plan_with_marker_objects(cls):
    plan = dtp.Plan.from_dict(cls._tp_plan)
    assert len(plan.rules) == len(cls._tp_plan)
    for rule, (key, value) in zip(plan.rules, cls._tp_plan.items()):
        assert rule.key == key
        if isinstance(value, str):
            assert rule.style.value == value
        else:
            assert rule.style.is_packed and rule.blocks == (tuple(value.blocks) if value.blocks else None)
    assert plan.attention is None  # inferred from the model at resolve time


def test_diffusers_dict_resolves_like_the_bundled_plan():
    model = tiny_model("Flux2Transformer2DModel")
    ours = dtp.tp_candidates(model, dtp.load_plan("flux2"))
    theirs = dtp.tp_candidates(model, dtp.Plan.from_dict(Flux2Transformer2DModel._tp_plan))
    assert ours == theirs == [1, 2, 4]


def test_plan_for_picks_the_bundled_plan():
    for name, cls in PLAN_CLASSES.items():
        assert dtp.plan_for(tiny_model(cls)) == dtp.load_plan(name)


def test_plan_for_unknown_model_says_what_to_do():
    import torch

    with pytest.raises(dtp.PlanError, match="no plan for Linear.*YAML"):
        dtp.plan_for(torch.nn.Linear(2, 2))


def test_unknown_bundled_name_lists_the_bundled_ones():
    with pytest.raises(dtp.PlanError, match="no bundled plan named 'nope'.*flux"):
        dtp.load_plan("nope")


def test_a_folder_named_like_a_bundled_plan_does_not_shadow_it(tmp_path, monkeypatch):
    """`load_plan("flux")` in a directory holding a folder `flux` (a checkpoint, say) is still the bundled plan;
    a missing YAML path is an error that names it."""
    (tmp_path / "flux").mkdir()
    monkeypatch.chdir(tmp_path)
    assert "FluxTransformer2DModel" in dtp.load_plan("flux").models
    with pytest.raises(dtp.PlanError, match="plan file missing.yaml does not exist"):
        dtp.load_plan("missing.yaml")


def test_cfg_refused_is_a_reason():
    """`cfg_refused` must say why (a non-empty string); the bundled OmniGen and Cosmos 3 Omni plans carry one,
    FLUX.1's none."""
    base = {"tp": {"blocks.*.attn.to_q": "colwise"}}
    assert dtp.Plan.from_dict({**base, "cfg_refused": "packed inputs."}).cfg_refused == "packed inputs."
    for bad in ("", "  ", True, ["x"]):
        with pytest.raises(dtp.PlanError, match="cfg_refused"):
            dtp.Plan.from_dict({**base, "cfg_refused": bad})
    assert dtp.load_plan("omnigen").cfg_refused and dtp.load_plan("cosmos3_omni").cfg_refused
    assert dtp.load_plan("flux").cfg_refused is None
