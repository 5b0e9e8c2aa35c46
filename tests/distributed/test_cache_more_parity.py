"""More caches, pipelines and meshes on 2 gloo processes (one process group): MagCache with its calibration (cp
Ulysses and ring, cfg), TaylorSeer and PAB on cfg=2's doubled-batch path (LTX-Video: one call on cat([uncond, cond])
per step, split over the cfg groups), FasterCache's doubled batch at cp=2 (CogVideoX), FirstBlockCache on the cfg batch
path (Qwen-Image, 2 images per prompt: the metric reduced over the cfg groups too), TaylorSeer / MagCache / PAB with
fsdp=True, SeaCache on Wan (cp, and cfg=2's pair and batch paths: its latents gathered over the batch split),
FasterCache on ring and with fsdp=True (CogVideoX's doubled batch), MagCache on cfg=2's doubled batch (LTX-Video,
calibration and inference). Each run equals the one-process cached run (pixels; MagCache's calibration ratios;
what ran per rank).

The default run keeps one case per (cache, mesh kind) that test_cache_parity.py does not already cover; further
pipelines of a covered kind (Qwen-Image and Wan with FirstBlockCache / TaylorSeer / PAB, FLUX.1's two-call
FasterCache at cp, ring and fsdp, MagCache inference at cfg and ring; Qwen-Image and Wan with MagCache's calibration
and inference, two-call FasterCache, FirstBlockCache / TaylorSeer / PAB at tp=2 and ring), the ring cases of
MagCache's calibration and CogVideoX's FasterCache (ring cuts the sequence as Ulysses does) and PAB and FasterCache
with fsdp=True (attention-skipping like TaylorSeer's fsdp case) are marked `full` (DTP_FULL=1) and are not spawned
without it.
"""

from __future__ import annotations

import os

import pytest
from cache_cases import BATCH_PATH, PER_STEP, STEPS, pipeline_job, pipeline_run

from dtp.pipeline.compare import compare
from dtp.testing.launch import spawn

MEAN_TOL = 1e-6  # measured: <= 3.0e-7 (LTX doubled batch at cfg=2), <= 1.7e-7 (cp, ring, fsdp), 0.0 (cfg pair path)
RATIO_TOL = 1e-6  # MagCache ratios, dtp's float64 token mean vs diffusers' fp32 one: measured <= 4.1e-8
T = (("threshold", 2.0),)  # FirstBlockCache on tiny Qwen-Image / Wan: 14 / 12 of 20 blocks run in one process
CAL = (("calibrate", True),)
FSDP = (("fsdp", True),)
LTX_TS = (("ltx", True),)  # TaylorSeer with LTX's attention names
WAN_TS = (("wan", True),)  # and with Wan's (attn1 / attn2): tiny Wan runs 24 of 40 attentions in one process
DOUBLED = (("doubled", True),)  # FasterCache in diffusers' default mode: the uncond half of the doubled batch rebuilt
S = (("threshold", 1.0),)  # SeaCache on tiny Wan: 12 of 20 blocks run in one process (0.25 skips nothing)
COUNTED = {
    "fbc": "block",
    "mag": "block",
    "sea": "block",
    "taylorseer": "attention",
    "pab": "attention",
    "faster": "attention",
}
FULL_RUN = os.environ.get("DTP_FULL") == "1"
DEFAULT = [
    ("flux", "mag", "cp=2", CAL),
    ("flux", "mag", "cfg=2", CAL),
    ("flux", "mag", "cp=2", ()),
    ("qwenimage_batch", "fbc", "cfg=2", T),
    ("ltx", "taylorseer", "cfg=2", LTX_TS),
    ("ltx", "pab", "cfg=2", ()),
    ("cogvideox", "faster", "cp=2", DOUBLED),
    ("flux", "taylorseer", "cp=2", FSDP),
    ("flux", "mag", "cp=2", FSDP),
    ("ltx", "mag", "cfg=2", CAL),
    ("ltx", "mag", "cfg=2", ()),
    ("wan", "sea", "cp=2", S),
    ("wan", "sea", "cfg=2", S),
    ("wan_batch", "sea", "cfg=2", S),
]
FULL = [
    # ring cuts the sequence as Ulysses does (it differs inside attention only, where no cache decides): a cache's
    # ring case repeats its cp=2 one (test_cache_parity.py keeps ring by default for FirstBlockCache, TaylorSeer, PAB)
    ("flux", "mag", "ring", CAL),
    ("cogvideox", "faster", "ring", DOUBLED),
    # fsdp=True: one block-skipping cache (MagCache; FirstBlockCache in test_fsdp_more.py) and one attention-skipping
    # cache (TaylorSeer) by default; PAB and FasterCache skip attentions the same way inside FSDP-managed blocks
    ("flux", "pab", "cp=2", FSDP),
    ("cogvideox", "faster", "cp=2", DOUBLED + FSDP),
    ("flux", "mag", "cfg=2", ()),
    ("flux", "mag", "ring", ()),
    ("flux", "faster", "cp=2", ()),
    ("flux", "faster", "ring", ()),
    ("flux", "faster", "cp=2", FSDP),
    ("qwenimage", "fbc", "cp=2", T),
    ("qwenimage", "fbc", "cfg=2", T),
    ("qwenimage", "taylorseer", "cp=2", ()),
    ("qwenimage_even", "pab", "cp=2", ()),
    ("qwenimage_even", "pab", "cfg=2", ()),
    ("wan", "fbc", "cp=2", T),
    ("wan", "fbc", "cfg=2", T),
    ("wan", "pab", "cp=2", ()),
    ("wan", "pab", "cfg=2", ()),
    ("wan", "sea", "ring", S),
    *[(p, "mag", m, CAL) for p in ("qwenimage", "wan") for m in ("cp=2", "ring", "cfg=2")],
    *[(p, "mag", m, ()) for p in ("qwenimage", "wan") for m in ("tp=2", "cp=2", "ring", "cfg=2")],
    *[(p, "faster", m, ()) for p in ("qwenimage_even", "wan") for m in ("tp=2", "cp=2", "ring")],
    *[(p, "fbc", m, T) for p in ("qwenimage", "wan") for m in ("tp=2", "ring")],
    *[("qwenimage", "taylorseer", m, ()) for m in ("tp=2", "ring", "cfg=2")],
    *[("wan", "taylorseer", m, WAN_TS) for m in ("tp=2", "cp=2", "ring", "cfg=2")],
    *[(p, "pab", m, ()) for p in ("qwenimage_even", "wan") for m in ("tp=2", "ring")],
]
RUNS = DEFAULT + (FULL if FULL_RUN else [])
PARAMS = [pytest.param(r, id=f"{r[0]}-{r[1]}-{r[2]}{''.join(f'-{k}' for k, _ in r[3])}") for r in DEFAULT] + [
    pytest.param(r, id=f"{r[0]}-{r[1]}-{r[2]}{''.join(f'-{k}' for k, _ in r[3])}", marks=pytest.mark.full) for r in FULL
]
PER_RANK = ("flux", "mag", "cp=2", CAL + (("per_rank", True),))  # the negative controls, run after RUNS
BATCH_PER_RANK = ("ltx", "mag", "cfg=2", CAL + (("per_rank", True),))
SEA_CUT = ("wan", "sea", "cp=2", S + (("cut", True),))
DRIFTED = [("ltx", "taylorseer", "cfg=2", LTX_TS + (("drift", True),)), ("ltx", "pab", "cfg=2", (("drift", True),))]


def _reference_options(options) -> dict:
    return {k: v for k, v in options if k != "fsdp"}  # one process: fsdp means nothing


@pytest.fixture(scope="module")
def refs():
    wanted = dict.fromkeys((p, n, _key(o)) for p, n, _, o in RUNS)  # fsdp runs share the plain run's reference
    return {(p, n, o): pipeline_run(p, n, **dict(o)) for p, n, o in wanted}


def _key(options) -> tuple:
    return tuple(sorted(_reference_options(options).items()))


@pytest.fixture(scope="module")
def results():
    return spawn(pipeline_job, 2, RUNS + [PER_RANK, BATCH_PER_RANK, SEA_CUT] + DRIFTED, timeout_s=900)


@pytest.mark.parametrize("run", PARAMS)
def test_matches_the_one_process_cached_run(results, refs, run):
    """Pixels within 1e-6 (mean, fp32) on every rank; what the cache skips (blocks or attentions) run per rank as in
    one process (cp, fsdp, the cfg batch path, PAB's shared state), or one branch each plus step 0 (cfg pair path)."""
    pipeline, name, mesh, options = run
    ref = refs[(pipeline, name, _key(options))]
    for rank in results:
        mean, p99, _ = compare(rank[run]["pixels"], ref["pixels"])
        assert mean <= MEAN_TOL, (run, mean, p99)
    what = COUNTED[name]
    counts = [rank[run][what] for rank in results]
    if mesh == "cfg=2" and pipeline not in BATCH_PATH and name != "pab":
        assert sum(counts) == ref[what] + PER_STEP[pipeline][what], (run, counts, ref[what])
    else:
        assert counts == [ref[what]] * 2, (run, counts, ref[what])
    assert [rank[run]["fsdp"] > 0 for rank in results] == [dict(options).get("fsdp", False)] * 2, run  # really sharded


def test_caches_skip_on_these_runs(refs):
    """Each inference run skips what its cache skips in one process (calibration never does), so equal counts
    mean something."""
    for (pipeline, name, options), ref in refs.items():
        if dict(options).get("calibrate"):
            continue
        what = COUNTED[name]
        assert ref[what] < STEPS * PER_STEP[pipeline][what], (pipeline, name, options, ref[what])


@pytest.mark.parametrize(
    "pipeline, mesh",
    [("flux", "cp=2"), pytest.param("flux", "ring", marks=pytest.mark.full), ("flux", "cfg=2"), ("ltx", "cfg=2")]
    + [pytest.param(p, m, marks=pytest.mark.full) for p in ("qwenimage", "wan") for m in ("cp=2", "ring", "cfg=2")],
)
def test_magcache_calibration_measures_the_one_process_ratios(results, refs, pipeline, mesh):
    """cp=2 (Ulysses, ring): each rank's ratios (token means over the whole sequence) are one process's. cfg=2, two
    calls (FLUX.1): group 0 measures the cond branch, group 1 the uncond one (both measure step 0). cfg=2, doubled
    batch (LTX-Video): each group holds half the batch; the mean over the whole batch is one process's ratio."""
    ref = refs[(pipeline, "mag", _key(CAL))]["ratios"]
    for g, rank in enumerate(results):
        seen = rank[(pipeline, "mag", mesh, CAL)]["ratios"]
        two_calls = mesh == "cfg=2" and pipeline not in BATCH_PATH
        expected = ref if not two_calls else ref[:2] + [r for r in ref[2:] if r[0] == ("cond", "uncond")[g]]
        assert [c for c, _ in seen] == [c for c, _ in expected]
        assert max(abs(a - b) for (_, a), (_, b) in zip(seen, expected)) <= RATIO_TOL


@pytest.mark.parametrize("control", [PER_RANK, BATCH_PER_RANK], ids=["cp=2", "cfg=2-batch"])
def test_per_rank_calibration_is_not_the_one_process_ratios(results, refs, control):
    """Negative controls: MagCache's calibration mean over each rank's own tokens at cp=2, or over each cfg group's
    half of LTX's doubled batch, misses the one-process ratios by far more than RATIO_TOL (the image is the same:
    calibration never skips)."""
    ref = refs[(control[0], "mag", _key(CAL))]["ratios"]
    for rank in results:
        seen = rank[control]["ratios"]
        assert max(abs(a - b) for (_, a), (_, b) in zip(seen, ref)) > 100 * RATIO_TOL


@pytest.mark.parametrize("control", DRIFTED, ids=["taylorseer", "pab"])
def test_a_rank_whose_cache_counters_drift_fails_the_batch_path_parity(results, refs, control):
    """Negative control for TaylorSeer and PAB on cfg=2's doubled batch (LTX): rank 1's counters one call ahead
    (an extra call counted on one rank) shift its schedule; the gathered image misses the one-process run on every
    rank (measured mean 0.15 TaylorSeer, 0.16 PAB), so test_matches_the_one_process_cached_run's bound would fail."""
    pipeline, name, _, options = control
    ref = refs[(pipeline, name, _key(tuple(o for o in options if o[0] != "drift")))]
    for rank in results:
        mean, _, _ = compare(rank[control]["pixels"], ref["pixels"])
        assert mean > 100 * MEAN_TOL, (control, mean)


def test_seacache_on_latents_cut_per_rank_is_an_error_on_every_rank(results):
    """Negative control: a raw_vision_callback returning each cp rank's half of the latents (as a model whose input
    dtp cut would) makes SeaCache's indicator per rank: a ForwardError on every rank, no hang (diffusers alone would
    fall back to running every block, silently)."""
    for rank in results:
        assert "differ between the cp ranks" in rank[SEA_CUT].get("error", ""), rank[SEA_CUT]


def test_pab_on_qwenimage_with_prompts_of_different_lengths_fails_in_one_process():
    """Qwen-Image's true CFG with PAB, prompts of 164 and 148 tokens: diffusers alone fails (PAB hands the uncond call
    the cond call's joint attention output), so no mesh is expected to run it; equal lengths run (the full cases)."""
    with pytest.raises(RuntimeError, match="must match the size"):
        pipeline_run("qwenimage", "pab")


@pytest.mark.full  # a second case of the kind above (one process, ~3 s): kept out of the default run
def test_faster_on_qwenimage_with_prompts_of_different_lengths_fails_in_one_process():
    """FasterCache's two-call mode on Qwen-Image, prompts of 164 and 148 tokens: diffusers alone fails the same way
    (the uncond call gets the cond call's attention output), so its Qwen-Image cases use equal lengths."""
    with pytest.raises(RuntimeError, match="must match the size"):
        pipeline_run("qwenimage", "faster")
