"""Activation peak of one forward on fake tensors (`dtp/analysis/forward.py`), the full-size inputs each family's
geometry gives (`dtp/analysis/inputs.py`), and the `dtp check` lines."""

import json

import diffusers
import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from dtp import PlanError
from dtp.analysis import forward as forward_module
from dtp.analysis.check import check
from dtp.analysis.forward import forward_peak
from dtp.analysis.inputs import ForwardShape, forward_inputs, latent_grid, video_size
from dtp.analysis.trace import truncate_blocks
from dtp.families import FAMILIES
from dtp.testing.tiny import TINY_CONFIGS
from dtp.tools.check import format_peak, format_report
from dtp.tools.cli import main

FLUX = "FluxTransformer2DModel"
# FLUX.1's structure at a width where activations, not fixed costs, make the peak: 4 heads of 64.
MEDIUM_FLUX = {
    **TINY_CONFIGS[FLUX],
    "num_attention_heads": 4,
    "attention_head_dim": 64,
    "joint_attention_dim": 256,
    "axes_dims_rope": (16, 24, 24),
}


def test_fake_peak_is_memtrackers_real_peak():
    """Medium FLUX.1 (fp32, 256 image + 64 text tokens), one rank: the fake-tensor peak equals torch's
    MemTracker on real tensors (total at peak minus parameters, buffers and inputs) within 2 %."""
    shape = ForwardShape(resolution=256, text_tokens=64)
    fake = forward_peak(FLUX, None, shape=shape, dtype=torch.float32, config=MEDIUM_FLUX).peak_bytes

    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel.from_config(MEDIUM_FLUX).eval()
    truncate_blocks(model, keep=1)  # as forward_peak traces it
    meta = forward_inputs(FLUX, dict(model.config), torch.float32, shape).kwargs
    inputs = {k: torch.randn(v.shape) if isinstance(v, torch.Tensor) else v for k, v in meta.items()}
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    tracker = MemTracker()
    tracker.track_external(model, *tensors)
    with torch.no_grad(), tracker:
        model(**inputs)
    total = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    resident = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers(), *tensors])
    assert fake > 3_000_000  # activations dominate: the comparison is not of two small constants
    assert abs(fake - (total - resident)) <= 0.02 * (total - resident), (fake, total - resident)


def test_cp_divides_flux_peak():
    """Medium FLUX.1 at 256 image + 64 text tokens: cp=4 (ulysses) holds <= 1.30 / 4 of one rank's peak; tp=4
    alone does not divide it as well (the residual stream stays whole). Measured 1.26 / 4 (1,602,500 of 5,086,980
    bytes): q, k and v go in one stacked all-to-all, whose receive buffer and laid-out result are both alive at
    once (three q-sized tensors each), one q-sized tensor more than three one-tensor exchanges held (1.00 / 4 then)."""
    shape = ForwardShape(resolution=256, text_tokens=64)
    one = forward_peak(FLUX, None, shape=shape, dtype=torch.float32, config=MEDIUM_FLUX).peak_bytes
    cp4 = forward_peak(FLUX, None, cp=4, shape=shape, dtype=torch.float32, config=MEDIUM_FLUX).peak_bytes
    tp4 = forward_peak(FLUX, None, tp=4, shape=shape, dtype=torch.float32, config=MEDIUM_FLUX).peak_bytes
    assert cp4 <= 1.30 * one / 4, (cp4, one)
    assert tp4 > cp4


@pytest.mark.parametrize(
    "class_name, shape, grid",
    [
        ("WanTransformer3DModel", ForwardShape(), (21, 60, 104)),  # 480p x 81: 32,760 tokens of patch 1x2x2
        ("HunyuanVideoTransformer3DModel", ForwardShape(), (33, 90, 160)),  # 720p x 129
        ("WanTransformer3DModel", ForwardShape(resolution=720, frames=81), (21, 90, 160)),  # 720p: 75,600
        ("LTXVideoTransformer3DModel", ForwardShape(), (21, 15, 22)),  # 32x VAE, 8x in time
        ("MochiTransformer3DModel", ForwardShape(), (28, 60, 106)),  # 6x in time
    ],
)
def test_latent_grid(class_name, shape, grid):
    assert latent_grid(class_name, video_size(FAMILIES[class_name].geometry, shape)) == grid


def test_latent_grid_refuses_frames_the_vae_cannot_take():
    with pytest.raises(PlanError, match="1 \\+ 4 k frames"):
        latent_grid("WanTransformer3DModel", (80, 480, 832))


def test_wan_tokens_are_the_issues():
    """Wan 2.1 14B at 480p x 81 frames: 32,760 video tokens (issue 21), a [1, 16, 21, 60, 104] latent."""
    inputs = forward_inputs("WanTransformer3DModel", _wan_full_config(), torch.bfloat16, ForwardShape())
    assert inputs.tokens == 32760 and tuple(inputs.kwargs["hidden_states"].shape) == (1, 16, 21, 60, 104)
    assert "81 frames of 480x832 px" in inputs.described


def _wan_full_config() -> dict:
    with torch.device("meta"):
        return dict(diffusers.WanTransformer3DModel().config)


@pytest.fixture(scope="module")
def tiny_flux_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps({"_class_name": FLUX, **TINY_CONFIGS[FLUX]}))
    return str(path)


def test_cli_peak_json_and_table(tiny_flux_config, capsys):
    """`dtp check flux --tp 1 --cp 2 --json`: the peak next to one rank's; the table prints it as `format_peak`."""
    argv = ["check", "flux", "--tp", "1", "--cp", "2", "--config", tiny_flux_config, "--resolution", "64", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    peak = report["activation_peak"]
    assert peak["input"] == "64x64 px, 16 image + 512 text tokens"
    assert peak["per_rank_bytes"] < peak["one_rank_bytes"]
    assert peak["ratio"] == pytest.approx(peak["per_rank_bytes"] / (peak["one_rank_bytes"] / 2))
    lines = format_peak(peak, "bf16")
    assert lines[0].startswith("activation peak of one forward (batch 1, bf16") and lines[0].endswith(peak["input"])
    assert [line.split()[:2] for line in lines[1:]] == [
        ["one", "rank"],
        ["per", "rank"],
        ["ideal", "one"],
        ["ratio", "per-rank/ideal"],
    ]
    assert "(cp=2, tp=1 ulysses)" in lines[2] and float(lines[4].split()[-1]) == pytest.approx(peak["ratio"], abs=1e-3)
    assert format_report(report).count("activation peak of one forward") == 1


def test_frames_are_for_video_models():
    with pytest.raises(PlanError, match="--frames 9 applies to a video model"):
        forward_inputs(FLUX, TINY_CONFIGS[FLUX], torch.bfloat16, ForwardShape(frames=9))


def _config_file(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"_class_name": FLUX, **config}))
    return str(path)


def test_check_traces_the_forward_once_for_collectives_and_peak(tmp_path, monkeypatch):
    """`dtp check --peak` traces two full-size forwards: the sharded one (collectives, peak and output bytes from one
    trace) and the one-rank reference; a second trace of the sharded model for the peak would make three."""
    traced = []
    trace_call = forward_module.trace_call
    monkeypatch.setattr(forward_module, "trace_call", lambda *a, **k: traced.append(1) or trace_call(*a, **k))
    config = _config_file(tmp_path, MEDIUM_FLUX)
    report = check("flux", tp=2, config=config, resolution=64, text_tokens=8, dtype="fp32", peak=True)
    assert len(traced) == 2
    assert report["collectives"]["count"] == 18 and report["activation_peak"]["per_rank_bytes"] > 0


def test_whole_depth_peak_is_the_cut_peak_for_alike_blocks(tmp_path):
    """Medium FLUX.1 at one rank: `dtp check`'s whole-depth trace (2 + 2 blocks) peaks at exactly the bytes of the
    one-block-per-list trace `dtp fit` and cp_peaks.py use (only the residual stream crosses a block)."""
    config = _config_file(tmp_path, MEDIUM_FLUX)
    report = check("flux", tp=1, config=config, resolution=256, text_tokens=64, dtype="fp32", peak=True)
    shape = ForwardShape(resolution=256, text_tokens=64)
    cut = forward_peak(FLUX, None, shape=shape, dtype=torch.float32, config=MEDIUM_FLUX, cut=True).peak_bytes
    assert report["activation_peak"]["per_rank_bytes"] == cut > 3_000_000, (report["activation_peak"], cut)
