"""parallelize_pipeline checks every component before it shards any; components without a plan stay whole."""

from types import SimpleNamespace

import pytest
from test_bad_plans import assert_unchanged, snapshot

import dtp
from dtp.families.pipelines import tiny_flux_pipeline, tiny_qwenimage_pipeline
from dtp.pipeline import WHOLE


@pytest.fixture(scope="module")
def mesh2(fake_world):
    return dtp.make_mesh(tp=2, cp=2, device_type="cpu")


def test_a_bad_plan_on_a_later_component_leaves_the_earlier_ones_untouched(mesh2):
    """text_encoder (CLIP) is prepared first and fits; text_encoder_2 (T5) gets a plan it cannot take."""
    pipe = tiny_flux_pipeline()
    names = [n for n in pipe.components if n in ("text_encoder", "text_encoder_2", "transformer")]
    assert names.index("text_encoder") < names.index("text_encoder_2")
    before = {n: snapshot(pipe.components[n]) for n in names}
    bad = dtp.Plan.from_dict({"encoder.block.*.layer.0.SelfAttention.qq": "colwise"}, name="bad")
    with pytest.raises(dtp.PlanError, match=r"plan bad.*SelfAttention\.qq' does not exist"):
        dtp.parallelize_pipeline(pipe, mesh2, {"text_encoder_2": bad})
    for name in names:
        assert_unchanged(pipe.components[name], before[name])


def test_components_without_a_plan_stay_whole_and_are_reported(mesh2):
    """WHOLE leaves a component with a plan whole; text encoders run on the tp axis; the VAE is split by rows
    (dtp.parallelize_vae: its weights stay whole on every rank)."""
    pipe = tiny_flux_pipeline()
    report = dtp.parallelize_pipeline(pipe, mesh2, {"text_encoder": WHOLE})
    plans = {c.name: c.plan for c in report.components}
    assert plans == {"vae": "rows", "text_encoder": None, "text_encoder_2": "t5", "transformer": "flux"}
    assert report.tp == 2
    for c in report.components:
        assert (c.local_bytes == c.whole_bytes) == (c.plan in (None, "rows")), c
    assert "text_encoder_2" in str(report) and "total" in str(report)


def test_the_tiny_qwenimage_text_encoder_splits_at_tp2():
    encoder = tiny_qwenimage_pipeline().text_encoder
    assert dtp.tp_candidates(encoder) == [1, 2]


@pytest.fixture(scope="module")
def mesh4(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


def _clip(heads: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=heads
    )
    return CLIPTextModel(config).eval()


def test_a_variant_plan_is_taken_where_the_first_does_not_fit(mesh4):
    """2 heads refuse tp=4 under `clip`; `clip-mlp` keeps the attention whole and fits. 4 heads take `clip`."""
    pipe = SimpleNamespace(components={"narrow": _clip(heads=2), "wide": _clip(heads=4)})
    report = dtp.parallelize_pipeline(pipe, mesh4)
    assert {c.name: c.plan for c in report.components} == {"narrow": "clip-mlp", "wide": "clip"}


def test_when_no_variant_fits_the_first_plan_s_error_names_the_component(mesh4):
    """vocabulary 190 (the tiny pipeline's CLIP) splits over neither plan at tp=4."""
    pipe = tiny_flux_pipeline()
    before = snapshot(pipe.text_encoder)
    with pytest.raises(
        dtp.PlanError, match=r"component 'text_encoder' \(CLIPTextModel\): plan clip: tp=4.*also tried: clip-mlp"
    ):
        dtp.parallelize_pipeline(pipe, mesh4)
    assert_unchanged(pipe.text_encoder, before)
