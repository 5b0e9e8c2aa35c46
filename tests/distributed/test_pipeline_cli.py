"""`dtp demo` and `dtp run` as a user runs them: torch's launcher, 2 gloo ranks, the tiny FLUX checkpoint.

One `dtp demo` call (it launches `dtp run` under torch.distributed.run, then once without it) is
shared by the checks below.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from dtp.demo import MEAN_TOLERANCE, P99_TOLERANCE, compare


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "DTP_CACHE": str(tmp / "cache")}
    command = [sys.executable, "-m", "dtp", "demo", "--nproc", "2", "--steps", "2", "--size", "32",
               "--output", str(tmp / "out.png")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    return done, tmp


def test_demo_exits_zero_and_prints_the_table(demo):
    done, _ = demo
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tp=2")]
    assert len(rows) == 2, done.stdout  # one row per rank
    assert re.search(r"p99 = \S+ \(tolerance 1e-02\): OK", done.stdout), done.stdout


def test_demo_writes_the_image_and_caches_the_checkpoint(demo):
    _, tmp = demo
    assert Image.open(tmp / "out.png").size == (32, 32)
    assert (tmp / "cache" / "tiny-flux-pipeline-v1" / "model_index.json").exists()


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
