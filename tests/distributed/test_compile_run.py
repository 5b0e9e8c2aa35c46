"""`dtp run --compile` as a user runs it: torchrun, 2 gloo ranks, the tiny FLUX.1 checkpoint in fp32, 3 steps.

The compiled run (`--compile eager`: regional, fullgraph, dynamo's eager backend, which traces what inductor
traces without generating code) draws the one-process eager run's pixels within 1e-5 (max |diff|) at
tp=2, and every rank's `--report` says 0 graph breaks and 0 recompiles after step 1. All `full` (suite time:
32 s a launch; regional compile runs by default in test_compile.py): tp=2, ring cp=2 and cfg=2 with true CFG
(the other meshes: test_compile_pipeline.py).
A run that did not compile has no "compile" entry in its report (`rank_report` adds it only for a compiled
transformer), so the first check cannot pass on an eager run; a recompile or a break is seen by the same counters
(tests/unit/test_compile_regions.py). Measured: 211 s wall on the shared 2-core machine (load ~20).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.serving import LAUNCHER, quiet_env
from dtp.tools.cli import main

TOL = 1e-5
REQUEST = ["--prompt", "a red cube", "--steps", "3", "--height", "32", "--width", "32", "--seed", "0"]
TRUE_CFG = ["--negative-prompt", "blurry", "--true-cfg-scale", "2.0"]


def _run(model_dir, out, request: list[str], *, mesh: list[str] | None) -> None:
    """`dtp run` writing pixels (and per-rank reports) under `out`: in this process (mesh None), else torchrun."""
    out.mkdir()
    argv = ["run", "--model-dir", str(model_dir), *request, "--dtype", "fp32", "--output", str(out / "out.png")]
    argv += ["--save-pixels", str(out / "pixels.npy"), "--report", str(out / "report.json")]
    if mesh is None:
        assert main(argv) == 0
        return
    command = [*LAUNCHER, "--standalone", "--nproc-per-node=2", "-m", "dtp", *argv, *mesh, "--compile", "eager"]
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(
    "mesh, request_args",
    [
        pytest.param([], REQUEST, id="tp2", marks=pytest.mark.full),  # suite time (32 s): test_compile by default
        pytest.param(["--cp", "2", "--cp-mode", "ring"], REQUEST, id="ring-cp2", marks=pytest.mark.full),
        pytest.param(["--cfg", "2"], [*REQUEST, *TRUE_CFG], id="cfg2-true-cfg", marks=pytest.mark.full),
    ],
)
def test_compiled_run_draws_the_eager_pixels(tmp_path, mesh, request_args):
    model_dir = tiny_checkpoint("flux")
    _run(model_dir, tmp_path / "eager", request_args, mesh=None)
    _run(model_dir, tmp_path / "compiled", request_args, mesh=mesh)
    for rank, report in enumerate(json.loads((tmp_path / "compiled" / "report.json").read_text())["ranks"]):
        found = report["compile"]
        assert found["graph_breaks"] == 0 and found["graphs"] >= 1 and found["recompiles"] == 0, (rank, found)
    eager = np.load(tmp_path / "eager" / "pixels.npy").astype(np.float64)
    diff = np.abs(np.load(tmp_path / "compiled" / "pixels.npy") - eager)
    assert diff.max() <= TOL, (diff.mean(), diff.max())
