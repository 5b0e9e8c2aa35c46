"""`dtp run --lora` as a user runs it: torch's launcher, 2 gloo ranks, the tiny FLUX checkpoint and a LoRA file,
against diffusers alone in this process (`DiffusionPipeline.from_pretrained`, `load_lora_weights`,
`set_adapters(adapter_weights=...)`: no dtp code on the reference's path, so a wrong `--lora-scale` cannot be
wrong on both sides). fp32 pixels within mean 1e-6 and a measured max; negative control: the reference at
scale 1.0 instead of 0.8 is far outside the bounds. Under DTP_FULL also `--cp 2 --fsdp --lora` against the same
reference, with each rank's transformer bytes (`--report`) showing that FSDP divided them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from diffusers import FluxTransformer2DModel
from lora_cases import random_lora
from safetensors.torch import save_file

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.pixels import MEAN_BOUND, pixel_error
from dtp.testing.reference import diffusers_pixels
from dtp.testing.tiny import tiny_model

SMALL = ["--steps", "2", "--height", "32", "--width", "32", "--seed", "0", "--prompt", "a cat"]
REFERENCE = dict(steps=2, height=32, width=32, seed=0)  # = SMALL, as diffusers' call arguments
SCALE = 0.8

# Suite time (24 s): LoRA under tp by the library is test_lora_parity_2 / _4 and test_fsdp_lora (default).
pytestmark = pytest.mark.full


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
    checkpoint = tiny_checkpoint("flux")  # the shared cache: built once per machine, only read
    lora = tmp / "lora.safetensors"
    save_file(random_lora(tiny_model("FluxTransformer2DModel"), seed=10), str(lora))
    lora_args = ["--lora", str(lora), "--lora-scale", str(SCALE)]
    sharded = dtp_run(checkpoint, tmp / "sharded.npy", *lora_args, nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert dtp_run_here(checkpoint, tmp / "base.npy") == 0
    return {
        "inputs": (checkpoint, lora_args, tmp),  # for the --fsdp case below
        "sharded": np.load(tmp / "sharded.npy"),
        "no lora": np.load(tmp / "base.npy"),
        "reference": diffusers_pixels(checkpoint, "a cat", **REFERENCE, lora=lora, lora_scale=SCALE),
        "scale 1.0": diffusers_pixels(checkpoint, "a cat", **REFERENCE, lora=lora, lora_scale=1.0),
    }


MAX_BOUND = 2e-6  # max |pixel diff|: measured 4.2e-7 (mean 7.9e-8)
# A rank's transformer bytes / whole with --fsdp on cp=2 after the run: measured 0.63 (the adapters and the gathered
# root included); without --fsdp >= 1 (whole, plus the adapters).
FSDP_HELD = 0.75


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


@pytest.mark.full  # the library path of LoRA on FSDP runs by default: test_fsdp_lora.py (cp=2 x tp=2, cfg=2 x cp=2)
def test_fsdp_lora_image_matches_diffusers(images):
    """`dtp run --cp 2 --fsdp --lora` (2 ranks, tp=1, FSDP over the cp ranks; peft's adapters on FSDP2's blocks) vs
    diffusers alone at scale 0.8: mean <= 1e-6, max <= MAX_BOUND."""
    checkpoint, lora_args, tmp = images["inputs"]
    report = tmp / "fsdp.json"
    run = dtp_run(checkpoint, tmp / "fsdp.npy", "--cp", "2", "--fsdp", *lora_args, "--report", str(report), nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    mean, worst = pixel_error(np.load(tmp / "fsdp.npy"), images["reference"])
    print(f"cp=2 --fsdp --lora vs diffusers: mean {mean:.2e}, max {worst:.2e}")
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (mean, worst)
    # FSDP ran: each rank holds a part of the transformer (without --fsdp, cp=2 holds it whole on both ranks)
    whole = FluxTransformer2DModel.from_pretrained(checkpoint, subfolder="transformer")
    whole_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    held = [r["transformer_bytes"] / whole_bytes for r in json.loads(report.read_text())["ranks"]]
    print(f"cp=2 --fsdp: transformer bytes per rank / whole {held}")
    assert all(h <= FSDP_HELD for h in held), held
