"""`dtp run` end to end on tiny released pipelines, whole (every component diffusers' pipeline takes, saved
with save_pretrained and loaded by `--model-dir` as a user's download is): one process (the reference, in this
process) vs torchrun with 2 gloo ranks (all `full`: `dtp run` itself is test_run_kinds'; each case ~20 s); every
frame's fp32 pixels within `run_cli`'s bounds, the mp4 decoding to the frames asked (the png to the size asked).

    Wan VACE          text to video through the VACE control branch (cp=2, tp=2)
    HunyuanVideo 1.5  Qwen2.5-VL + ByT5 text, diffusers' guider (true CFG: two transformer calls a step), its
                      3-level causal VAE (cp=2, tp=2)
    FLUX.3            diffusers' modular pipeline (a modular_model_index.json folder, `dtp.pipeline.modular`):
                      Qwen3-VL text through the text-only processor (no torchvision here), the guider's true CFG,
                      FLUX.2's VAE (cp=2, tp=2); with a reference image (`--image`: the image_cond stream, cp=2)

LTX-2 (video + audio) is test_run_ltx2's. Negative control: a seed offset by the rank in `run_request` fails these
as it fails test_run_kinds' cases.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from run_cli import assert_close, generate

from dtp.pipeline.outputs import read_video
from dtp.testing.conditioned_pipelines import sample_image
from dtp.testing.released_pipelines import save_tiny_flux3, tiny_hunyuanvideo15_pipeline, tiny_wan_vace_pipeline

FRAMES = 5


def _save_with_reference(folder) -> None:
    """The FLUX.3 folder and a 32 x 32 reference image in it (the image_cond stream: its own blocks and tokens)."""
    save_tiny_flux3(folder)
    sample_image(32).save(folder / "reference.png")


FLUX3_ARGS = ["--pipeline-arg", "text_encoder_out_layers=[1,2]"]  # the tiny Qwen3-VL's 2 layers, stacked
CASES = {  # save(folder), size, extra flags, frames (None: an image)
    "wan_vace": (
        lambda f: tiny_wan_vace_pipeline().save_pretrained(f),
        16,
        ["--pipeline-arg", "max_sequence_length=16"],
        FRAMES,
    ),
    "hunyuan15": (lambda f: tiny_hunyuanvideo15_pipeline().save_pretrained(f), 32, [], FRAMES),
    "flux3": (save_tiny_flux3, 32, FLUX3_ARGS, None),  # the tokenizer folder a Qwen3-VL processor's, as released
    "flux3_image": (_save_with_reference, 32, [*FLUX3_ARGS, "--image", "{folder}/reference.png"], None),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return tmp_path_factory.mktemp("released")


def _argv(saved, kind: str) -> list[str]:
    save, size, extra, frames = CASES[kind]
    if not (saved / kind).exists():
        save(saved / kind)
    size_args = ["--height", str(size), "--width", str(size)]
    size_args += [] if frames is None else ["--frames", str(frames)]
    extra = [arg.format(folder=saved / kind) for arg in extra]
    return ["--model-dir", str(saved / kind), "--steps", "2", *size_args, *extra]


@pytest.mark.parametrize(
    "kind, mesh",
    [
        pytest.param("wan_vace", ["--cp", "2"], id="wan-vace-cp2", marks=pytest.mark.full),
        pytest.param("wan_vace", [], id="wan-vace-tp2", marks=pytest.mark.full),
        pytest.param("hunyuan15", ["--cp", "2"], id="hunyuan15-cp2", marks=pytest.mark.full),
        pytest.param("hunyuan15", [], id="hunyuan15-tp2", marks=pytest.mark.full),
        pytest.param("flux3", ["--cp", "2"], id="flux3-cp2", marks=pytest.mark.full),
        pytest.param("flux3", [], id="flux3-tp2", marks=pytest.mark.full),
        pytest.param("flux3_image", ["--cp", "2"], id="flux3-image-cp2", marks=pytest.mark.full),
    ],
)
def test_released_pipeline_on_two_ranks_draws_the_one_process_frames(saved, tmp_path, kind, mesh):
    argv = _argv(saved, kind)
    _, size, _, frames = CASES[kind]
    suffix = "png" if frames is None else "mp4"
    generate(argv, tmp_path / "ref", suffix=suffix, mesh=None)
    generate(argv, tmp_path / "two", suffix=suffix, mesh=mesh)
    reference, pixels = (np.load(tmp_path / run / "pixels.npy") for run in ("ref", "two"))
    shape = (size, size, 3) if frames is None else (frames, size, size, 3)
    assert reference.shape == shape
    diff = np.abs(pixels.astype(np.float64) - reference)
    print(f"{kind} {' '.join(mesh) or 'tp 2'}: mean {diff.mean():.2e} max {diff.max():.2e}")
    assert_close(pixels, reference)
    written = tmp_path / "two" / f"out.{suffix}"
    assert (np.asarray(Image.open(written)) if frames is None else read_video(written)).shape == shape
