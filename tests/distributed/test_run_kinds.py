"""`dtp run` on every pipeline kind as a user runs it: tiny saved Wan 2.1 text-to-video, Wan image-to-video,
FLUX.1 Kontext and FLUX.2 (with a reference image) pipelines, one process (the reference, in this process) vs
torchrun with 2 gloo ranks.

Two launches by default (each torchrun pays 2 ranks' imports; CPU is scarce): Wan I2V at tp=2 reading a JSONL file
of two generations and one bad line (the image, `--image`, enters every line's latents as channels), and FLUX.2 at
cp=2 (the reference image's tokens join the sequence that cp cuts); with DTP_FULL=1 also Wan I2V alone at tp=2, Wan
T2V and FLUX.1 Kontext at cp=2. Every frame's fp32 pixels: mean |diff| <= 1e-6 and max <= 1e-4 (measured: Wan T2V
tp=2 ~2e-7 / 1e-6, I2V tp=2 1.8e-7 / 1.1e-6, FLUX.2 cp=2 1.5e-7 / 9.8e-7); each mp4 decodes to the frames asked.
Negative control: a seed offset by the rank in `run_request` fails the cases (seen on Wan T2V, mean 0.050, and
FLUX.2). A different reference image moves FLUX.2's pixels by mean 0.004, so a rank that dropped the image would fail
too. Qwen-Image-Edit has no case: see `dtp.testing.conditioned_pipelines`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_cli import assert_close, generate

from dtp.pipeline.outputs import read_video
from dtp.testing.conditioned_pipelines import (
    sample_image,
    tiny_flux2_pipeline,
    tiny_flux_kontext_pipeline,
    tiny_wan_i2v_pipeline,
    tiny_wan_video_pipeline,
)

FRAMES = 5
BUILDERS = {
    "wan": tiny_wan_video_pipeline,
    "wan_i2v": tiny_wan_i2v_pipeline,
    "kontext": tiny_flux_kontext_pipeline,
    "flux2": tiny_flux2_pipeline,
}
IMAGE_KINDS = ("kontext", "flux2")
WAN = ["--steps", "2", "--height", "16", "--width", "16", "--frames", str(FRAMES)]
WAN += ["--pipeline-arg", "max_sequence_length=16"]
KONTEXT = ["--steps", "2", "--height", "32", "--width", "32"]
KONTEXT += ["--pipeline-arg", "max_area=1024", "--pipeline-arg", "_auto_resize=false"]
# One text encoder layer stacked (the released model stacks layers 10, 20, 30); diffusers refuses references < 64².
FLUX2 = ["--steps", "2", "--height", "32", "--width", "32"]
FLUX2 += ["--pipeline-arg", "text_encoder_out_layers=[1]", "--pipeline-arg", "max_sequence_length=32"]
LINES = [
    {"prompt": "a cat", "seed": 1, "output": "{out}/cat.mp4"},
    {"prompt": "a dog", "seed": 2, "frames": 4},  # 4 is not 2k + 1: refused, the others run
    {"prompt": "a bird", "seed": 3, "size": "16x16", "steps": 1},
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder for the tiny pipelines (each saved with save_pretrained on first use) and three input images."""
    root = tmp_path_factory.mktemp("kinds")
    sample_image(16).save(root / "in16.png")
    sample_image(32, seed=1).save(root / "in32.png")
    sample_image(64, seed=2).save(root / "in64.png")
    return root


def _model_dir(saved, kind: str) -> str:
    if not (saved / kind).exists():  # only the kinds this run asks for: building and saving one takes seconds
        BUILDERS[kind]().save_pretrained(saved / kind)
    return str(saved / kind)


def _args(saved, kind: str) -> list[str]:
    model = ["--model-dir", _model_dir(saved, kind)]
    if kind == "wan":
        return [*model, *WAN]
    if kind == "wan_i2v":
        return [*model, "--image", str(saved / "in16.png"), *WAN]
    if kind == "flux2":
        return [*model, "--image", str(saved / "in64.png"), *FLUX2]
    return [*model, "--image", str(saved / "in32.png"), *KONTEXT]


def _generate(saved, kind: str, out, *, mesh: list[str] | None, extra=()) -> str:
    """`dtp run` of `kind` writing under `out`: in this process (mesh None) or under torchrun; returns its stderr."""
    suffix = "png" if kind in IMAGE_KINDS else "mp4"
    return generate(_args(saved, kind), out, suffix=suffix, mesh=mesh, extra=extra)


@pytest.mark.parametrize(
    "kind, mesh",
    [
        pytest.param("wan", ["--cp", "2"], id="wan-t2v-cp2", marks=pytest.mark.full),  # video at cp: test_serve_video
        pytest.param("wan_i2v", [], id="wan-i2v-tp2", marks=pytest.mark.full),  # the --prompts launch is I2V at tp=2
        pytest.param("kontext", ["--cp", "2"], id="kontext-cp2", marks=pytest.mark.full),  # reference image at cp
        pytest.param("flux2", ["--cp", "2"], id="flux2-cp2", marks=pytest.mark.full),  # suite time (20 s)
    ],
)
def test_two_ranks_draw_the_one_process_pixels(saved, tmp_path, kind, mesh):
    """Every frame of the sharded run equals the one-process run's; the mp4 holds the frames asked."""
    _generate(saved, kind, tmp_path / "ref", mesh=None)
    _generate(saved, kind, tmp_path / "two", mesh=mesh)
    reference, pixels = (np.load(tmp_path / run / "pixels.npy") for run in ("ref", "two"))
    assert_close(pixels, reference)
    if kind in IMAGE_KINDS:
        assert reference.shape == (32, 32, 3)
    else:
        assert reference.shape == (FRAMES, 16, 16, 3)
        assert read_video(tmp_path / "two" / "out.mp4").shape == (FRAMES, 16, 16, 3)


def test_prompts_file_loads_once_and_skips_a_bad_line(saved, tmp_path):
    """--prompts at tp=2 on Wan I2V: lines 1 and 3 generate (equal to one process), line 2 is named and skipped,
    exit 1."""
    for run in ("ref", "two"):
        (tmp_path / run).mkdir()
        lines = [json.dumps({k: v.format(out=tmp_path / run) if k == "output" else v for k, v in line.items()})
                 for line in LINES]  # fmt: skip
        (tmp_path / run / "batch.jsonl").write_text("\n".join(lines) + "\n")
    _generate(saved, "wan_i2v", tmp_path / "ref", mesh=None, extra=["--prompts", str(tmp_path / "ref" / "batch.jsonl")])
    stderr = _generate(
        saved, "wan_i2v", tmp_path / "two", mesh=[], extra=["--prompts", str(tmp_path / "two" / "batch.jsonl")]
    )
    assert "line 2: frames 4 is not 2k + 1" in stderr, stderr[-2000:]
    for run in ("ref", "two"):
        assert read_video(tmp_path / run / "cat.mp4").shape == (FRAMES, 16, 16, 3)
        assert read_video(tmp_path / run / "out-3.mp4").shape == (FRAMES, 16, 16, 3)
        assert not (tmp_path / run / "out-2.mp4").exists()
    for line in (1, 3):
        assert_close(np.load(tmp_path / "two" / f"pixels-{line}.npy"), np.load(tmp_path / "ref" / f"pixels-{line}.npy"))
