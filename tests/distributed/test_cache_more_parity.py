"""More caches and pipelines on 2 gloo processes (one process group): MagCache with its calibration, FasterCache,
and FirstBlockCache / TaylorSeer on tiny Qwen-Image (two calls per step, and 2 images per prompt: the cfg batch
path, where the metric is reduced over the cfg groups too) and Wan (video). Each run equals the one-process cached
run (pixels; MagCache's calibration ratios; what ran per rank)."""

from __future__ import annotations

import pytest
from cache_cases import pipeline_job, pipeline_run

from dtp.pipeline.compare import compare
from dtp.testing.launch import spawn

MEAN_TOL = 1e-6  # measured: <= 1.6e-7 (cp), 0.0 (cfg=2 pair path), 1.4e-7 (cfg=2 batch path)
RATIO_TOL = 1e-6  # MagCache ratios, dtp's float64 token mean vs diffusers' fp32 one: measured <= 4.1e-8
T = (("threshold", 2.0),)  # FirstBlockCache on tiny Qwen-Image / Wan: 14 / 12 of 20 blocks run in one process
CAL = (("calibrate", True),)
RUNS = [
    ("flux", "mag", "cp=2", CAL),
    ("flux", "mag", "cfg=2", CAL),
    ("flux", "mag", "cp=2", ()),
    ("flux", "mag", "cfg=2", ()),
    ("flux", "faster", "cp=2", ()),
    ("qwenimage", "fbc", "cp=2", T),
    ("qwenimage", "fbc", "cfg=2", T),
    ("qwenimage_batch", "fbc", "cfg=2", T),
    ("qwenimage", "taylorseer", "cp=2", ()),
    ("wan", "fbc", "cp=2", T),
    ("wan", "fbc", "cfg=2", T),
]
STEP0 = {"flux": 8, "qwenimage": 4, "wan": 4}  # blocks of step 0's two calls, run by both cfg groups
IDS = [f"{p}-{n}-{m}{'-calibrate' if o == CAL else ''}" for p, n, m, o in RUNS]
PER_RANK = ("flux", "mag", "cp=2", CAL + (("per_rank", True),))  # the negative control, run after RUNS


@pytest.fixture(scope="module")
def refs():
    return {(p, n, o): pipeline_run(p, n, **dict(o)) for p, n, _, o in RUNS}


@pytest.fixture(scope="module")
def results():
    return spawn(pipeline_job, 2, RUNS + [PER_RANK], timeout_s=900)


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_matches_the_one_process_cached_run(results, refs, run):
    """Pixels within 1e-6 (mean, fp32) on every rank; blocks run per rank as in one process (cp, cfg batch path),
    or one branch each plus step 0 (cfg pair path)."""
    pipeline, name, mesh, options = run
    ref = refs[(pipeline, name, options)]
    for rank in results:
        mean, p99, _ = compare(rank[run]["pixels"], ref["pixels"])
        assert mean <= MEAN_TOL, (run, mean, p99)
    counts = [rank[run]["block"] for rank in results]
    if mesh == "cfg=2" and pipeline != "qwenimage_batch":
        assert sum(counts) == ref["block"] + STEP0[pipeline], (run, counts, ref["block"])
    else:
        assert counts == [ref["block"]] * 2, (run, counts, ref["block"])


def test_caches_skip_on_these_runs(refs):
    """Each inference run skips blocks in one process (calibration never does), so equal counts mean something."""
    for (pipeline, name, options), ref in refs.items():
        uncached = 2 * 5 * (4 if pipeline == "flux" else 2)
        if name == "faster":
            assert ref["attention"] < 2 * 5 * 4, ref["attention"]  # FasterCache skips attentions, not blocks
        elif options == CAL or name == "taylorseer":
            continue
        else:
            assert ref["block"] < uncached, (pipeline, name, ref["block"])


@pytest.mark.parametrize("mesh", ["cp=2", "cfg=2"])
def test_magcache_calibration_measures_the_one_process_ratios(results, refs, mesh):
    """cp=2: each rank's ratios (token means over the whole sequence) are one process's. cfg=2: group 0 measures the
    cond branch, group 1 the uncond one (both measure step 0)."""
    ref = refs[("flux", "mag", CAL)]["ratios"]
    for g, rank in enumerate(results):
        seen = rank[("flux", "mag", mesh, CAL)]["ratios"]
        expected = ref if mesh == "cp=2" else ref[:2] + [r for r in ref[2:] if r[0] == ("cond", "uncond")[g]]
        assert [c for c, _ in seen] == [c for c, _ in expected]
        assert max(abs(a - b) for (_, a), (_, b) in zip(seen, expected)) <= RATIO_TOL


def test_per_rank_calibration_is_not_the_one_process_ratios(results, refs):
    """Negative control: MagCache's calibration mean over each rank's own tokens at cp=2 misses the one-process
    ratios by far more than RATIO_TOL (the image is the same: calibration never skips)."""
    ref = refs[("flux", "mag", CAL)]["ratios"]
    for rank in results:
        seen = rank[PER_RANK]["ratios"]
        assert max(abs(a - b) for (_, a), (_, b) in zip(seen, ref)) > 100 * RATIO_TOL
