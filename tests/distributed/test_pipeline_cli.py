"""`dtp demo`, `dtp run` and examples/tensor_parallel_flux.py as a user runs them: torch's launcher,
2 gloo ranks, the tiny FLUX checkpoint.

One `dtp demo` call (it launches `dtp run` under torch.distributed.run, then once without it) is
shared by the checks below; the example runs once more under the launcher on the demo's checkpoint. The
demo's tp=2 image is compared with diffusers alone (`DiffusionPipeline.from_pretrained`, same prompt, seed
and size) pixel by pixel: the PNG's 8-bit levels equal the reference's rounded levels but for a rounding edge.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dtp.families.pipelines import DEMO_PROMPT as PROMPT
from dtp.pipeline.compare import MEAN_TOLERANCE, P99_TOLERANCE, compare
from dtp.testing.reference import diffusers_pixels

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tensor_parallel_flux.py"
SMALL = [
    "--steps",
    "2",
    "--height",
    "32",
    "--width",
    "32",
    "--seed",
    "0",
]  # = the demo run below (seed 0 is its default)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "DTP_CACHE": str(tmp / "cache")}
    command = [
        sys.executable,
        "-m",
        "dtp",
        "demo",
        "--nproc",
        "2",
        "--steps",
        "2",
        "--size",
        "32",
        "--output",
        str(tmp / "out.png"),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    return done, tmp


@pytest.mark.full  # suite time (19 s): the demo tests draw the same image through dtp run
def test_example_script_draws_the_demo_image(demo):
    """examples/tensor_parallel_flux.py at tp=2, same checkpoint and seed: the demo's image within one PNG level (the
    example shards the transformer only, the demo the text encoders too: CLIP's rowwise biases join rank 0's matmul
    before the all-reduce, a different rounding; measured: 1 of 3072 values one level off)."""
    _, tmp = demo
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(EXAMPLE),
        "--model",
        str(tmp / "cache" / "tiny-flux-pipeline-v3"),
        *SMALL,
        "--output",
        str(tmp / "example.png"),
    ]
    done = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tp degrees this transformer supports: [1, 2, 4]" in done.stdout
    example, demo_image = (np.asarray(Image.open(tmp / name), dtype=np.int16) for name in ("example.png", "out.png"))
    diff = np.abs(example - demo_image)
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.01, (diff.max(), (diff > 0).mean())


def test_demo_exits_zero_and_prints_the_table(demo):
    done, _ = demo
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tp=2")]
    assert len(rows) == 2, done.stdout  # one row per rank
    assert re.search(r"p99 = \S+ \(tolerance 1e-02\): OK", done.stdout), done.stdout


def test_demo_writes_the_image_and_caches_the_checkpoint(demo):
    _, tmp = demo
    assert Image.open(tmp / "out.png").size == (32, 32)
    assert (tmp / "cache" / "tiny-flux-pipeline-v3" / "model_index.json").exists()


def test_demo_image_is_diffusers_image(demo):
    """The demo's tp=2 PNG against diffusers' one-process pixels, rounded to 8 bits as `save_image` does: no level
    off by more than 1 and at most 0.1 % of them off at all (fp32 differences ~1e-7 flip a level only at a rounding
    edge; measured 0 of 3072 off). Negative control: the reference at another seed differs in most levels."""
    _, tmp = demo
    checkpoint = tmp / "cache" / "tiny-flux-pipeline-v3"
    image = np.asarray(Image.open(tmp / "out.png")).astype(np.int64)
    levels = {}
    for seed in (0, 1):
        pixels = diffusers_pixels(checkpoint, PROMPT, steps=2, height=32, width=32, seed=seed)
        levels[seed] = np.abs((pixels * 255).round().clip(0, 255).astype(np.int64) - image)
    print(f"demo png vs diffusers: {int((levels[0] > 0).sum())} of {levels[0].size} levels off, max {levels[0].max()}")
    assert levels[0].max() <= 1 and (levels[0] > 0).mean() <= 1e-3, levels[0].max()
    assert (levels[1] > 0).mean() > 0.5, (levels[1] > 0).mean()


def test_progress_bar_on_rank_zero_only(demo):
    """Two runs print bars: the tp=2 run (rank 0 only) and the one-process reference; rank 1 stays quiet."""
    done, _ = demo
    started_bars = re.findall(r"(?:^|[\r\n])\s*0%\|[^\r\n]*\| 0/2 \[", done.stderr)  # tqdm draws each bar at 0 once
    assert len(started_bars) == 2, done.stderr[-3000:]


def test_compare_flags_a_mismatch():
    """The demo's verdict: equal images pass; a 0.03 shift on 2 % of the pixels fails p99."""
    a = np.random.default_rng(0).random((32, 32, 3), dtype=np.float32)
    assert compare(a, a.copy())[2]
    b = a.copy()
    b.reshape(-1)[::50] += 0.03
    mean, p99, ok = compare(a, b)
    assert mean <= MEAN_TOLERANCE and p99 > P99_TOLERANCE and not ok


def test_demo_refuses_a_tp_degree_the_plan_cannot_take(demo, monkeypatch):
    """tp=3 does not divide the tiny FLUX's 4 heads: a clear message before any process is launched."""
    from dtp.tools.cli import main

    _, tmp = demo
    monkeypatch.setenv("DTP_CACHE", str(tmp / "cache"))
    with pytest.raises(
        SystemExit, match=r"--nproc 3 is not a TP degree .* supported: 1, 2, 4; with --pad: 1, 2, 3, 4\."
    ):
        main(["demo", "--nproc", "3"])
