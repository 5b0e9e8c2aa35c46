"""parallelize_pipeline checks every component before it shards any; components without a plan stay whole."""

import pytest
from test_bad_plans import assert_unchanged, snapshot

import dtp
from dtp.pipeline import WHOLE
from dtp.testing.pipelines import tiny_flux_pipeline, tiny_qwenimage_pipeline


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
    """The VAE has no plan; WHOLE leaves a component with one whole too; text encoders run on the tp axis."""
    pipe = tiny_flux_pipeline()
    report = dtp.parallelize_pipeline(pipe, mesh2, {"text_encoder": WHOLE})
    plans = {c.name: c.plan for c in report.components}
    assert plans == {"vae": None, "text_encoder": None, "text_encoder_2": "t5", "transformer": "flux"}
    assert report.tp == 2
    for c in report.components:
        assert (c.local_bytes == c.whole_bytes) == (c.plan is None), c
    assert "text_encoder_2" in str(report) and "total" in str(report)


def test_the_tiny_qwenimage_text_encoder_splits_at_tp2():
    encoder = tiny_qwenimage_pipeline().text_encoder
    assert dtp.tp_candidates(encoder) == [1, 2]
