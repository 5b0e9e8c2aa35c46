"""`dtp run --lora` as a user runs it: torch's launcher, 2 gloo ranks, the tiny FLUX checkpoint and a LoRA file,
against the one-process `dtp run` with diffusers' own `load_lora_weights` (called in the test's process: the
same code path, without two more interpreter starts)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from lora_cases import random_lora
from safetensors.torch import save_file

from dtp.families.pipelines import tiny_checkpoint
from dtp.pipeline.compare import compare
from dtp.testing.tiny import tiny_model

SMALL = ["--steps", "2", "--height", "32", "--width", "32", "--seed", "0", "--prompt", "a cat"]


def dtp_run(checkpoint, pixels, *extra, nproc: int = 1) -> subprocess.CompletedProcess:
    """`dtp run` under torch's launcher on `nproc` processes, as a user starts it."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command = [sys.executable, *launcher, "-m", "dtp", "run", *_run_args(checkpoint, pixels, *extra)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def dtp_run_here(checkpoint, pixels, *extra) -> int:
    """The one-process `dtp run` (diffusers' own LoRA loader), in this process: the same code path as the
    command without an interpreter start; the libraries' logging settings it changes are put back."""
    import diffusers
    import transformers

    from dtp.tools.cli import main

    saved = [(lib.utils.logging, lib.utils.logging.get_verbosity()) for lib in (diffusers, transformers)]
    try:
        return main(["run", *_run_args(checkpoint, pixels, *extra)])
    finally:
        for logging, verbosity in saved:
            logging.set_verbosity(verbosity)
            logging.enable_progress_bar()


def _run_args(checkpoint, pixels, *extra) -> list[str]:
    return [
        "--model-dir", str(checkpoint), *SMALL, *extra, "--output", str(pixels.with_suffix(".png")),
        "--save-pixels", str(pixels),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_run")
    checkpoint = tiny_checkpoint("flux", root=tmp / "cache")
    lora = tmp / "lora.safetensors"
    save_file(random_lora(tiny_model("FluxTransformer2DModel"), seed=10), str(lora))
    lora_args = ["--lora", str(lora), "--lora-scale", "0.8"]
    sharded = dtp_run(checkpoint, tmp / "sharded.npy", *lora_args, nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert dtp_run_here(checkpoint, tmp / "reference.npy", *lora_args) == 0
    assert dtp_run_here(checkpoint, tmp / "base.npy") == 0
    return {
        name: np.load(tmp / f"{file}.npy")
        for name, file in (("sharded", "sharded"), ("reference", "reference"), ("no lora", "base"))
    }


def test_sharded_lora_image_matches_one_process(images):
    """tp=2 with --lora (scale 0.8) vs one process with diffusers' loader: within the demo's pixel tolerance."""
    mean, p99, ok = compare(images["sharded"], images["reference"])
    print(f"tp=2 --lora vs 1 process: mean {mean:.2e}, p99 {p99:.2e}")
    assert ok, (mean, p99)


def test_the_lora_changes_the_image(images):
    """The comparison means something: the LoRA moves the one-process image well past the tolerance."""
    mean, p99, ok = compare(images["reference"], images["no lora"])
    print(f"1 process, --lora vs none: mean {mean:.2e}, p99 {p99:.2e}")
    assert not ok and mean > 1e-2, (mean, p99)
