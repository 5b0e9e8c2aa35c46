"""End to end on CPU (gloo, 2 ranks): sharded diffusers pipelines generate the image of one device.

One process group for the module: every rank generates with the unsharded pipeline (the reference)
and with the tp=2 one, for the tiny FLUX.1 checkpoint (loaded from disk, prompt through its random
CLIP + T5 encoders) and a tiny Qwen-Image pipeline (prompt embeddings given directly).
"""

from __future__ import annotations

import filecmp

import numpy as np
import pytest
import torch

from dtp.launch import spawn
from dtp.pipeline import tiny_flux_checkpoint

MEAN_TOLERANCE, P99_TOLERANCE = 1e-3, 1e-2  # on [0, 1] pixels, fp32
FLUX = dict(prompt="a cat holding a sign that says hello", steps=3, height=32, width=32, seed=0)
QWEN = dict(steps=3, height=32, width=32, seed=0, true_cfg_scale=1.0)


def _rank_job(rank: int, world_size: int, flux_dir: str) -> dict:
    import dtp
    from dtp.memory import local_param_bytes
    from dtp.pipeline import tiny_qwenimage_pipeline
    from dtp.run import generate, load_pipeline

    mesh = dtp.make_mesh(tp=world_size)
    cpu, fp32 = torch.device("cpu"), torch.float32
    ref = load_pipeline(flux_dir, device=cpu, dtype=fp32)
    sharded = load_pipeline(flux_dir, device=cpu, dtype=fp32, mesh=mesh, plan="flux")
    qwen_ref, embeds = tiny_qwenimage_pipeline()
    qwen_sharded, _ = tiny_qwenimage_pipeline()
    dtp.parallelize(qwen_sharded.transformer, mesh, dtp.load_plan("qwenimage"))
    for pipe in (ref, sharded, qwen_ref, qwen_sharded):
        pipe.set_progress_bar_config(disable=True)
    out = {
        "flux_ref": generate(ref, **FLUX)[0],
        "flux_tp": generate(sharded, **FLUX)[0],
        "flux_bytes": (local_param_bytes(ref.transformer), local_param_bytes(sharded.transformer)),
        "qwen_ref": generate(qwen_ref, **QWEN, **embeds)[0],
        "qwen_tp": generate(qwen_sharded, **QWEN, **embeds)[0],
    }
    # Sensitivity of the measure: a 1 % error in every transformer weight must fail the tolerance.
    with torch.no_grad():
        for param in ref.transformer.parameters():
            param.mul_(1.01)
    out["flux_off"] = generate(ref, **FLUX)[0]
    return out


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return tiny_flux_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def results(flux_dir):
    return spawn(_rank_job, 2, str(flux_dir))


def _pixel_diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    diff = np.abs(a - b)
    return float(diff.mean()), float(np.quantile(diff, 0.99))


@pytest.mark.parametrize("name", ["flux", "qwen"])
def test_tp2_image_matches_one_device(results, name):
    """FLUX.1 and Qwen-Image tiny, tp=2 vs unsharded, fp32: mean |diff| <= 1e-3 and p99 <= 1e-2 on [0, 1] pixels."""
    for rank in results:
        mean, p99 = _pixel_diff(rank[f"{name}_tp"], rank[f"{name}_ref"])
        assert mean <= MEAN_TOLERANCE and p99 <= P99_TOLERANCE, (name, mean, p99)


@pytest.mark.parametrize("name", ["flux", "qwen"])
def test_every_rank_generates_the_same_image(results, name):
    """Same seeded latents and all-reduced activations: rank 1's image is rank 0's, bit for bit."""
    np.testing.assert_array_equal(results[0][f"{name}_tp"], results[1][f"{name}_tp"])


def test_images_are_not_blank(results):
    """The comparison means something only if the pixels vary and are mostly not clipped."""
    for name in ("flux_ref", "qwen_ref"):
        pixels = results[0][name]
        assert pixels.std() > 0.05 and ((pixels > 0) & (pixels < 1)).mean() > 0.9, name


def test_tolerance_catches_a_one_percent_weight_error(results):
    """Every transformer weight x 1.01 moves the FLUX image beyond the tolerance."""
    mean, p99 = _pixel_diff(results[0]["flux_off"], results[0]["flux_ref"])
    assert mean > MEAN_TOLERANCE or p99 > P99_TOLERANCE, (mean, p99)


def test_sharded_transformer_holds_less_than_the_whole(results):
    """Each rank's transformer weights: less than 3/4 of the unsharded bytes at tp=2 (replicated norms, embedders)."""
    for rank in results:
        whole, local = rank["flux_bytes"]
        assert local < 0.75 * whole, (local, whole)


def test_checkpoint_creation_is_deterministic(flux_dir, tmp_path):
    """A second first-use creation writes byte-identical weights and configs."""
    again = tiny_flux_checkpoint(tmp_path)
    files = sorted(p.relative_to(flux_dir) for p in flux_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    mismatched = [f for f in files if not filecmp.cmp(flux_dir / f, again / f, shallow=False)]
    assert not mismatched, mismatched
