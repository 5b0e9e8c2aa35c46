"""The wording fixes of issue 25: a video model's forward in frames x height x width, parameters a block holds
itself named, `dtp verify`'s summary, and pad=True suggested for a vision tower whose heads tp does not divide."""

import pytest
import torch

import dtp
from dtp.analysis.check import replicated_modules
from dtp.analysis.fakepg import fake_world
from dtp.analysis.inputs import ForwardShape, forward_inputs
from dtp.analysis.verify import MODEL, Site, VerifyReport
from dtp.plan import load_plan
from dtp.resolve import resolve
from dtp.testing.tiny import TINY_CONFIGS, tiny_model
from dtp.testing.tiny_vision import meta_vision_model

WAN, COGVIDEOX, LTX, FLUX = (
    "WanTransformer3DModel",
    "CogVideoXTransformer3DModel",
    "LTXVideoTransformer3DModel",
    "FluxTransformer2DModel",
)


def _grid(cls: str, inputs: dict) -> tuple[int, int, int]:
    """(frames, height, width) of the latent video, read here from each layout as diffusers documents it."""
    if cls == LTX:
        return inputs["num_frames"], inputs["height"], inputs["width"]
    b, c_or_f, f_or_c, h, w = inputs["hidden_states"].shape
    return (f_or_c, h, w) if cls != COGVIDEOX else (c_or_f, h, w)


@pytest.mark.parametrize("cls", [WAN, COGVIDEOX, LTX])
def test_a_video_forward_is_described_as_frames_height_width(cls):
    """The usual clip in pixels, then the latent video (frames x height x width) its tensors really hold."""
    inputs = forward_inputs(cls, dict(TINY_CONFIGS[cls]), torch.float32, ForwardShape())
    assert inputs.pixels.endswith("= latent video {} x {} x {}".format(*_grid(cls, inputs.kwargs))), inputs.pixels
    assert " frames of " in inputs.pixels


def test_an_image_forward_is_described_in_pixels():
    inputs = forward_inputs(FLUX, dict(TINY_CONFIGS[FLUX]), torch.float32, ForwardShape(resolution=1024))
    assert inputs.pixels == "1024x1024 px"


def test_a_parameter_a_block_holds_itself_is_named():
    """Wan's blocks.N.scale_shift_table: listed by its name, never as a bare `blocks.*`."""
    model = tiny_model(WAN)
    entries = [r["module"] for r in replicated_modules(model, resolve(load_plan("wan"), model))]
    assert "blocks.*.scale_shift_table" in entries, entries
    assert "blocks.*" not in entries and "" not in entries, entries
    assert "blocks.*.norm2" in entries, entries  # a leaf module keeps its module path


def _report(rels) -> VerifyReport:
    sites = [Site(f"blocks.{i}.attn", "output", 0, "colwise", rel) for i, rel in enumerate(rels)]
    sites.append(Site("", "output", 0, MODEL, max(rels)))
    return VerifyReport(model="M", plan="p", tp=2, tol=1e-5, sites=tuple(sites))


def test_verify_summary_has_counts_and_verdict_not_the_table():
    report = _report([1e-7, 3e-2, 5e-1])
    summary = report.format(verbose=False).splitlines()
    assert len(summary) <= 5, summary
    assert "4 sites compared, 3 beyond tolerance (largest 5.000e-01 at the output of blocks.2.attn)" in summary[1]
    assert summary[2].startswith("DIVERGES first at the output of blocks.1.attn"), summary
    assert len(report.format(verbose=True).splitlines()) == len(summary) - 1 + 4  # the table: one line per site


def test_verify_summary_of_a_clean_run():
    summary = _report([1e-7, 2e-7]).format(verbose=False).splitlines()
    assert summary[1] == "  3 sites compared, 0 beyond tolerance; per site: --verbose"
    assert summary[-1].startswith("OK: every site within")


@pytest.mark.parametrize(
    ("cls", "vision"),
    [
        ("Qwen2_5_VLForConditionalGeneration", dict(num_heads=2, hidden_size=32)),
        ("Mistral3ForConditionalGeneration", dict(num_attention_heads=2, hidden_size=32)),
    ],
)
def test_a_vision_tower_refusal_suggests_pad(cls, vision):
    """2 vision heads at tp=4: refused with the pad=True hint, and pad=True is accepted."""
    model = meta_vision_model(cls, vision)
    with fake_world(4):
        mesh = dtp.make_mesh(tp=4, device_type="cpu")
        with pytest.raises(dtp.PlanError, match=r"tp=4 does not divide num_heads .*=2.* Or pass pad=True"):
            dtp.prepare(model, mesh, dtp.plan_for(model))
        assert dtp.prepare(model, mesh, dtp.plan_for(model), pad=True) is not None
