"""`dtp run --lora` as a user runs it: torch's launcher, 2 gloo ranks, the tiny FLUX checkpoint and a LoRA file,
against diffusers alone in this process (`DiffusionPipeline.from_pretrained`, `load_lora_weights`,
`set_adapters(adapter_weights=...)`: no dtp code on the reference's path, so a wrong `--lora-scale` cannot be
wrong on both sides). fp32 pixels within mean 1e-6 and a measured max; negative control: the reference at
scale 1.0 instead of 0.8 is far outside the bounds."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from lora_cases import random_lora
from safetensors.torch import save_file

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.pixels import MEAN_BOUND, pixel_error
from dtp.testing.reference import diffusers_pixels
from dtp.testing.tiny import tiny_model

SMALL = ["--steps", "2", "--height", "32", "--width", "32", "--seed", "0", "--prompt", "a cat"]
REFERENCE = dict(steps=2, height=32, width=32, seed=0)  # = SMALL, as diffusers' call arguments
SCALE = 0.8


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
    lora_args = ["--lora", str(lora), "--lora-scale", str(SCALE)]
    sharded = dtp_run(checkpoint, tmp / "sharded.npy", *lora_args, nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert dtp_run_here(checkpoint, tmp / "base.npy") == 0
    return {
        "sharded": np.load(tmp / "sharded.npy"),
        "no lora": np.load(tmp / "base.npy"),
        "reference": diffusers_pixels(checkpoint, "a cat", **REFERENCE, lora=lora, lora_scale=SCALE),
        "scale 1.0": diffusers_pixels(checkpoint, "a cat", **REFERENCE, lora=lora, lora_scale=1.0),
    }


MAX_BOUND = 2e-6  # max |pixel diff|: measured 4.2e-7 (mean 7.9e-8)


def test_sharded_lora_image_matches_diffusers(images):
    """tp=2 with --lora (scale 0.8) vs diffusers alone at scale 0.8: mean <= 1e-6, max <= MAX_BOUND."""
    mean, worst = pixel_error(images["sharded"], images["reference"])
    print(f"tp=2 --lora vs diffusers: mean {mean:.2e}, max {worst:.2e}")
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (mean, worst)


def test_a_wrong_scale_fails(images):
    """Negative control: the same LoRA at scale 1.0 (a --lora-scale dropped) misses both bounds."""
    mean, worst = pixel_error(images["sharded"], images["scale 1.0"])
    print(f"tp=2 --lora 0.8 vs diffusers at 1.0: mean {mean:.2e}, max {worst:.2e}")
    assert mean > 100 * MEAN_BOUND and worst > 100 * MAX_BOUND, (mean, worst)


def test_the_lora_changes_the_image(images):
    """The comparison means something: the LoRA moves the one-process image by more than 1e-2 on average."""
    mean, worst = pixel_error(images["reference"], images["no lora"])
    print(f"1 process, --lora vs none: mean {mean:.2e}, max {worst:.2e}")
    assert mean > 1e-2, (mean, worst)
