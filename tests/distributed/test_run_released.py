"""`dtp run` end to end on tiny released video pipelines, whole (every component diffusers' pipeline takes, saved
with save_pretrained and loaded by `--model-dir` as a user's download is): one process (the reference, in this
process) vs torchrun with 2 gloo ranks (all `full`: `dtp run` itself is test_run_kinds'; each case ~20 s); every
frame's fp32 pixels within `run_cli`'s bounds, the mp4 decoding to the frames asked.

    Wan VACE          text to video through the VACE control branch (cp=2, tp=2)
    HunyuanVideo 1.5  Qwen2.5-VL + ByT5 text, diffusers' guider (true CFG: two transformer calls a step), its
                      3-level causal VAE (tp=2, with DTP_FULL=1)

Negative control: a seed offset by the rank in `run_request` fails these as it fails test_run_kinds' cases.
"""

from __future__ import annotations

import numpy as np
import pytest
from run_cli import assert_close, generate

from dtp.pipeline.outputs import read_video
from dtp.testing.released_pipelines import tiny_hunyuanvideo15_pipeline, tiny_wan_vace_pipeline

FRAMES = 5
CASES = {
    "wan_vace": (tiny_wan_vace_pipeline, 16, ["--pipeline-arg", "max_sequence_length=16"]),
    "hunyuan15": (tiny_hunyuanvideo15_pipeline, 32, []),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return tmp_path_factory.mktemp("released")


def _argv(saved, kind: str) -> list[str]:
    build, size, extra = CASES[kind]
    if not (saved / kind).exists():
        build().save_pretrained(saved / kind)
    size_args = ["--height", str(size), "--width", str(size), "--frames", str(FRAMES)]
    return ["--model-dir", str(saved / kind), "--steps", "2", *size_args, *extra]


@pytest.mark.parametrize(
    "kind, mesh",
    [
        pytest.param("wan_vace", ["--cp", "2"], id="wan-vace-cp2", marks=pytest.mark.full),
        pytest.param("wan_vace", [], id="wan-vace-tp2", marks=pytest.mark.full),
        pytest.param("hunyuan15", ["--cp", "2"], id="hunyuan15-cp2", marks=pytest.mark.full),
        pytest.param("hunyuan15", [], id="hunyuan15-tp2", marks=pytest.mark.full),
    ],
)
def test_released_pipeline_on_two_ranks_draws_the_one_process_frames(saved, tmp_path, kind, mesh):
    argv = _argv(saved, kind)
    generate(argv, tmp_path / "ref", suffix="mp4", mesh=None)
    generate(argv, tmp_path / "two", suffix="mp4", mesh=mesh)
    reference, pixels = (np.load(tmp_path / run / "pixels.npy") for run in ("ref", "two"))
    size = CASES[kind][1]
    assert reference.shape == (FRAMES, size, size, 3)
    assert_close(pixels, reference)
    assert read_video(tmp_path / "two" / "out.mp4").shape == (FRAMES, size, size, 3)
