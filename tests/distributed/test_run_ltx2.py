"""`dtp run` of the tiny released-shape LTX-2 pipeline (video + audio: Gemma 3, its connectors, the video VAE, the audio
VAE and the vocoder), saved with save_pretrained: one process (the reference, in this process) vs torchrun with 2
gloo ranks at tp=2 (the transformer and Gemma 3 sharded, the video VAE split by rows), default guidance (classifier-
free, STG at block 1, modality: 3 calls and 4 passes per step), and cfg=2 (the step path: the doubled batch on
group 0, the STG and modality calls on group 1). `full` (DTP_FULL=1): the cfg step path's default test is
test_cfg_steps_2.py. Every frame's fp32 pixels within mean 1e-6 and max
1e-4 of one process; the mp4 decodes to the 9 frames of 32 x 32 asked.
"""

from __future__ import annotations

import numpy as np
import pytest
from run_cli import MAX_BOUND, MEAN_BOUND, torchrun_dtp

from dtp.pipeline.outputs import read_video
from dtp.testing.ltx2_pipeline import tiny_ltx2_pipeline
from dtp.tools.cli import main

pytestmark = pytest.mark.full  # a save, one process and a torchrun of 2 ranks each: ~20 s of CPU (suite budget)

FRAMES, SIZE = 9, 32
ARGS = ["--steps", "2", "--height", str(SIZE), "--width", str(SIZE), "--frames", str(FRAMES), "--prompt", "a cat"]
ARGS += ["--pipeline-arg", "spatio_temporal_guidance_blocks=[1]", "--pipeline-arg", "max_sequence_length=16"]
ARGS += ["--pipeline-arg", "frame_rate=22.5", "--dtype", "fp32"]  # 0.4 s: 10 audio tokens, a multiple of cp


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny LTX-2 pipeline saved, and its one-process `dtp run` pixels."""
    root = tmp_path_factory.mktemp("ltx2_run")
    tiny_ltx2_pipeline().save_pretrained(root / "model")
    assert main(["run", "--model-dir", str(root / "model"), *ARGS, *_outputs(root / "ref")]) == 0
    return root


def _outputs(folder) -> list[str]:
    folder.mkdir(exist_ok=True)
    return ["--output", str(folder / "out.mp4"), "--save-pixels", str(folder / "pixels.npy")]


@pytest.mark.parametrize(  # the ranks not given to cp or cfg go to tp: 2 processes and no flag = tp=2
    "mesh", [pytest.param([], id="tp2"), pytest.param(["--cp", "2"], id="cp2"), pytest.param(["--cfg", "2"], id="cfg2")]
)
def test_two_ranks_draw_the_one_process_video(saved, tmp_path, mesh):
    """Every frame of the 2-rank run equals the one-process run's; the mp4 holds the 9 frames asked."""
    argv = ["--model-dir", str(saved / "model"), *ARGS, *_outputs(tmp_path), *mesh]
    done = torchrun_dtp(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    reference, pixels = np.load(saved / "ref" / "pixels.npy"), np.load(tmp_path / "pixels.npy")
    assert reference.shape == pixels.shape == (FRAMES, SIZE, SIZE, 3)
    for frame, (mine, theirs) in enumerate(zip(pixels.astype(np.float64), reference)):
        diff = np.abs(mine - theirs)
        print(f"frame {frame}: mean {diff.mean():.2e} max {diff.max():.2e}")
        assert diff.mean() <= MEAN_BOUND and diff.max() <= MAX_BOUND, (frame, diff.mean(), diff.max())
    assert read_video(tmp_path / "out.mp4").shape == (FRAMES, SIZE, SIZE, 3)
