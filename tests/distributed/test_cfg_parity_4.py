"""The cfg axis with tensor and context parallelism inside each cfg group (4 gloo processes).

One process group: at (cfg=2, tp=2) Qwen-Image with true_cfg_scale (two calls per step), PixArt-Sigma
(a doubled batch) and Wan (video, two calls); at (cfg=2, cp=2) Qwen-Image with its sequence split
(Ulysses) inside each group; the composition at (cfg=2, tp=2): the Qwen-Image checkpoint through
`dtp.load_pipeline` (shard-on-load, sharded text encoder, parallel VAE over all 4 ranks) with a LoRA; then
the negative control at (cfg=2, tp=2).
"""

from __future__ import annotations

import numpy as np
import pytest
from cfg_cases import LOADED_CASE, STEPS, generate, loaded_pipeline, rank_job, references, tag
from lora_cases import random_lora
from safetensors.torch import save_file

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.launch import spawn
from dtp.testing.pixels import pixel_error
from dtp.testing.tiny import tiny_model

MEAN_TOL = 1e-6
MAX_TOL = 1e-5  # max |pixel diff| of every cfg image: measured 5.1e-7..2.6e-6 (PixArt; its mean 4.0e-7)
RUNS = [(dict(cfg=2, tp=2), ["qwenimage", "pixart", "wan"]), (dict(cfg=2, cp=2), ["qwenimage"])]
SWAPPED = ["wan"]
CHECKS = [(tag(dims), case) for dims, cases in RUNS for case in cases]


@pytest.fixture(scope="module")
def refs():
    return references({case for _, cases in RUNS for case in cases})


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The tiny Qwen-Image checkpoint (the shared cache, only read: test_fit_measured and three unit modules use it
    too, so it is built once per machine, not afresh here) and a LoRA file on every Linear of its transformer."""
    tmp = tmp_path_factory.mktemp("cfg_loaded")
    lora = tmp / "lora.safetensors"
    save_file(random_lora(tiny_model("QwenImageTransformer2DModel"), seed=10), str(lora))
    return str(tiny_checkpoint("qwenimage")), str(lora)


@pytest.fixture(scope="module")
def results(loaded):
    return spawn(rank_job, 4, RUNS, SWAPPED, loaded)


@pytest.mark.parametrize("mesh,case", CHECKS)
def test_matches_one_process(results, refs, mesh, case):
    """(cfg=2, tp=2) and (cfg=2, cp=2) vs one process, fp32 pixels: mean |diff| <= 1e-6, max <= 1e-5; all 4
    ranks the same image."""
    for rank in results:
        image = rank[(mesh, case)]
        mean, worst = pixel_error(image, refs[case])
        print(f"{case}: mean {mean:.2e} max {worst:.2e}")
        assert image.shape == refs[case].shape
        assert mean <= MEAN_TOL and worst <= MAX_TOL, (mesh, case, mean, worst)
        np.testing.assert_array_equal(image, results[0][(mesh, case)])


def test_paths_taken(results):
    """Pair calls answered by the exchange, the doubled batch split, inside (cp, tp) groups too."""
    for mesh, case in CHECKS:
        stats = results[0][(mesh, case, "stats")]
        if case == "pixart":
            assert stats == dict(batch=STEPS, predicted=0, hits=0, whole=0), stats
        else:
            assert stats == dict(batch=0, predicted=STEPS - 1, hits=STEPS - 1, whole=2), (mesh, case, stats)


@pytest.mark.parametrize("case", SWAPPED)
def test_swapped_branches_fail_the_tolerance(results, refs, case):
    """Negative control: at (cfg=2, tp=2), each group taking the other's branch fails both tolerances."""
    mean, worst = pixel_error(results[0][("swapped", case)], refs[case])
    assert mean > 100 * MEAN_TOL and worst > 100 * MAX_TOL, (case, mean, worst)


def test_loaded_pipeline_with_lora_matches_one_process(results, loaded):
    """cfg=2 x tp=2 with everything a user loads: shard-on-load, the LoRA, the sharded text encoder and the VAE
    split over all 4 ranks give the one-process image of diffusers' own loaders (and the pair path ran)."""
    reference = generate(loaded_pipeline(*loaded), LOADED_CASE)
    lora_off = generate(loaded_pipeline(*loaded, lora_scale=0.0), LOADED_CASE)
    assert pixel_error(lora_off, reference)[0] > 1e-3, "the LoRA must move the image, else this test proves nothing"
    for rank in results:
        image = rank["loaded"]["pixels"]
        mean, worst = pixel_error(image, reference)
        print(f"loaded with LoRA: mean {mean:.2e} max {worst:.2e}")
        assert mean <= MEAN_TOL and worst <= MAX_TOL, (mean, worst)
    assert results[0]["loaded"]["stats"] == dict(batch=0, predicted=STEPS - 1, hits=STEPS - 1, whole=2)
