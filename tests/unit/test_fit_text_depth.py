"""`dtp fit`'s text phase at full depth against MemTracker, on an encoder deep enough for the depth to matter.

Qwen-Image's pipeline calls its Qwen2.5-VL text encoder with `output_hidden_states=True`: every layer's hidden state
stays alive to the end of the call, so the peak grows with the depth. fit traces the encoder cut to 1 and 2 layers
and extrapolates (`fit/measure.py::_text_peak`); the reference runs the whole 8-layer encoder on real tensors under
torch's MemTracker. Dropping the extrapolation (the one-layer peak) misses the bound: the negative control.
"""

import json
import shutil
from unittest import mock

import pytest
import torch

from dtp.families.pipelines import tiny_checkpoint
from dtp.fit import measure
from dtp.fit.measure import Measurer, Setup
from dtp.fit.pipelines import Shape, fit_pipeline, text_inputs

DEPTH = 8
WIDTH = 64  # a layer's hidden state (TOKENS x WIDTH fp32) is then a sizeable part of one layer's peak
TOKENS = 256
SHAPE = Shape(1, 32, 32, 1, TOKENS)
TOL = 0.10  # measured: fit - MemTracker = -0.1 % of MemTracker (see the test's printout)


@pytest.fixture(scope="module")
def deep_pipeline(tmp_path_factory):
    """The tiny Qwen-Image pipeline's directory with its text encoder made 8 layers deep and 64 wide (configs only:
    fit builds every component on meta, the reference with random weights)."""
    directory = tmp_path_factory.mktemp("deep-text") / "pipeline"
    shutil.copytree(tiny_checkpoint("qwenimage"), directory)
    path = directory / "text_encoder" / "config.json"
    config = json.loads(path.read_text())
    text = config["text_config"]
    text.update(num_hidden_layers=DEPTH, hidden_size=WIDTH, layer_types=["full_attention"] * DEPTH)
    text["rope_parameters"]["mrope_section"] = [2, 2, 4]  # half a head (64 / 4 heads / 2) in (t, h, w) sections
    config["vision_config"]["out_hidden_size"] = WIDTH
    path.write_text(json.dumps(config))
    return str(directory)


def _memtracker_peak(directory: str) -> int:
    """MemTracker's peak of the whole encoder's call (fp32, real tensors) less its weights: the activation peak."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(f"{directory}/text_encoder")
    encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    kwargs = {k: torch.zeros_like(v, device="cpu") if isinstance(v, torch.Tensor) else v for k, v in
              text_inputs(encoder, SHAPE).items()}  # fmt: skip
    kwargs["attention_mask"][:, TOKENS // 2 :] = 1  # a padded prompt: transformers then builds its mask, as the
    # fake trace does (it cannot see that an all-ones mask needs none)
    tracker = MemTracker()
    tracker.track_external(encoder)
    with torch.no_grad(), tracker:
        encoder(**kwargs)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return peak["Total"] - peak.get("Parameter", 0) - peak.get("Buffer", 0)


def _fit_peak(directory: str) -> int:
    measurer = Measurer(fit_pipeline(directory), torch.float32, cache=False)
    return measurer.phase("text_encoder", Setup(), SHAPE).peak_bytes


def test_text_phase_counts_every_layers_hidden_state(deep_pipeline):
    """fit's text peak of an 8-layer encoder that keeps each layer's hidden state: within 10 % of MemTracker's;
    the one-layer peak (the extrapolation dropped) is not."""
    reference = _memtracker_peak(deep_pipeline)
    fitted = _fit_peak(deep_pipeline)
    with mock.patch.object(measure, "_text_peak", lambda one, two, lengths: one.peak_bytes):
        dropped = _fit_peak(deep_pipeline)
    print(f"MemTracker {reference:,} B; fit {fitted:,} B ({fitted / reference - 1:+.1%}); one layer {dropped:,} B")
    assert abs(fitted - reference) <= TOL * reference, (fitted, reference)
    assert abs(dropped - reference) > TOL * reference, (dropped, reference)
