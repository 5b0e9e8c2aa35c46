"""The cfg axis over every pass of a step at cfg=2 (2 gloo processes): the tiny LTX-2 pipeline, 4 passes per step.

One process group: LTX-2 with classifier-free, spatio-temporal (STG) and modality guidance (group 0 runs the
doubled batch, group 1 the STG and modality calls, one exchange per step); the same with STG and modality turned
off from step 1 on (passes varying by step: the prediction is dropped, the step learned anew); the host reads per
step against diffusers' own pipeline; a call whose 3 passes cfg=2 does not divide (PlanError before the transformer
runs); the negative control, each group decoding the other's passes as its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from steps_cases import CASES, STEPS, count_syncs, errors, rank_job, references, tag

from dtp.testing.launch import spawn
from dtp.testing.ltx2_pipeline import tiny_ltx2_pipeline

MEAN_TOL = 1e-6
MESH = dict(cfg=2)
TAG = tag(MESH)


@pytest.fixture(scope="module")
def refs():
    return references(CASES)


@pytest.fixture(scope="module")
def results():
    return spawn(rank_job, 2, [(MESH, list(CASES))], MESH, True, True)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_one_process(results, refs, case):
    """cfg=2 vs one process, fp32: video frames and audio mean |diff| <= 1e-6; both ranks the same."""
    for rank in results:
        video, audio = errors(rank[(TAG, case)], refs[case])
        print(f"{case}: video {video:.2e} audio {audio:.2e}")
        assert rank[(TAG, case)][0].shape == refs[case][0].shape
        assert video <= MEAN_TOL and audio <= MEAN_TOL, (case, video, audio)
        np.testing.assert_array_equal(rank[(TAG, case)][0], results[0][(TAG, case)][0])


def test_paths_taken(results):
    """Steps 1 and 2 ran on the step path, their later calls answered by the exchange; with the guidance off from
    step 1 on, step 1's predicted STG and modality calls never came (dropped) and step 2 ran per call."""
    calls, steps = results[0][(TAG, "ltx2", "stats")]
    assert steps == dict(steps=STEPS - 1, answered=2 * (STEPS - 1), missed=0, dropped=0), steps
    assert calls == dict(batch=1, predicted=0, hits=0, whole=2), calls  # step 0, learning: the per-call paths
    calls, steps = results[0][(TAG, "ltx2_varying", "stats")]
    assert steps == dict(steps=1, answered=0, missed=0, dropped=2), steps
    assert calls == dict(batch=2, predicted=0, hits=0, whole=2), calls


def test_host_reads_per_step(results):
    """Steps 2..3 read what diffusers' one-process pipeline reads, no more: the step's latents, a new object each
    step, are compared on the device (`passes.TRUSTED_ROWS`), read once after the generation."""
    (mine, _), (theirs, _) = results[0]["syncs"], count_syncs(tiny_ltx2_pipeline())
    print(f"dtp cfg=2 {mine}\ndiffusers {theirs}")
    for kind, count in mine.items():
        assert count <= theirs[kind], (kind, mine, theirs)


def test_one_exchange_per_step(results):
    """A step on the step path: one all_gather (every pass's output), the two later calls' hit flags agreed."""
    _, collectives = results[0]["syncs"]
    assert collectives == {"allgather": 1, "all_reduce": 2}, collectives  # c10d names: all_gather of a list


def test_a_degree_that_does_not_divide_the_passes_is_refused(results):
    """No STG: 3 passes per step, cfg=2: a PlanError naming the passes and the degrees, before any block ran."""
    message, block_calls = results[0]["refusal"]
    assert message.startswith("PlanError") and "3 transformer passes" in message and "[1, 3]" in message, message
    assert block_calls == 0


def test_swapped_groups_fail_the_tolerance(results, refs):
    """Negative control: each group decoding the other's passes (uncond/cond <-> STG/modality) fails."""
    video, audio = errors(results[0]["control"], refs["ltx2"])
    assert video > 100 * MEAN_TOL and audio > 100 * MEAN_TOL, (video, audio)
