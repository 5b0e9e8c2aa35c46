"""`dtp run` as a user runs it, for tests: in this process (the one-device reference) or under torchrun with 2 gloo
ranks, its fp32 pixels saved with `--save-pixels`, and the bound two runs' pixels must meet."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from dtp.testing.serving import LAUNCHER, quiet_env

MEAN_BOUND, MAX_BOUND = 1e-6, 1e-4  # fp32 pixels in [0, 1]: measured 1e-7 .. 3e-7 mean on the tiny pipelines


def torchrun_dtp(argv: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node N -m dtp run ...`, quiet, captured."""
    command = [*LAUNCHER, "--standalone", f"--nproc-per-node={nproc}", "-m", "dtp", "run", *argv]
    return subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=900)


def generate(argv: list[str], out: Path, *, suffix: str, mesh: list[str] | None, extra=()) -> str:
    """`dtp run argv` writing `out/out.<suffix>` and `out/pixels.npy`: in this process (mesh None) or under
    torchrun with `mesh` (e.g. ["--cp", "2"]; [] for the default tp over 2 ranks); returns torchrun's stderr."""
    from dtp.tools.cli import main

    out.mkdir(exist_ok=True)
    argv = [*argv, "--dtype", "fp32", "--output", str(out / f"out.{suffix}")]
    argv += ["--save-pixels", str(out / "pixels.npy"), *extra]
    argv += [] if "--prompts" in extra else ["--prompt", "a cat"]
    if mesh is None:
        assert main(["run", *argv]) in (0, 1)
        return ""
    done = torchrun_dtp([*argv, *mesh])
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.stderr


def assert_close(pixels: np.ndarray, reference: np.ndarray) -> None:
    """Same shape; mean |diff| <= MEAN_BOUND and max <= MAX_BOUND."""
    assert pixels.shape == reference.shape
    diff = np.abs(pixels.astype(np.float64) - reference)
    assert diff.mean() <= MEAN_BOUND and diff.max() <= MAX_BOUND, (diff.mean(), diff.max())
