"""The cfg axis over every pass of a step on 4 gloo processes: the tiny LTX-2 pipeline, 4 passes per step.

One process group (`full`: 4 ranks of a pipeline with a Gemma 3 encoder cost well over 30 s on 2 cores): at cfg=4
each group runs one pass (uncond and cond rows of the doubled batch on groups 0 and 1, STG on 2, modality on 3),
one exchange per step; at (cfg=2, tp=2) the cfg=2 split with the transformer sharded inside each group; the
negative control at cfg=4, each group decoding another group's pass as its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from steps_cases import STEPS, errors, rank_job, references, tag

from dtp.testing.launch import spawn

pytestmark = pytest.mark.full

MEAN_TOL = 1e-6
RUNS = [(dict(cfg=4), ["ltx2"]), (dict(cfg=2, tp=2), ["ltx2"])]
CHECKS = [(tag(dims), case) for dims, cases in RUNS for case in cases]


@pytest.fixture(scope="module")
def refs():
    return references(["ltx2"])


@pytest.fixture(scope="module")
def results():
    return spawn(rank_job, 4, RUNS, dict(cfg=4), False, False)


@pytest.mark.parametrize("mesh,case", CHECKS)
def test_matches_one_process(results, refs, mesh, case):
    """cfg=4 and (cfg=2, tp=2) vs one process, fp32: video frames and audio mean |diff| <= 1e-6; all ranks equal."""
    for rank in results:
        video, audio = errors(rank[(mesh, case)], refs[case])
        print(f"{mesh} {case}: video {video:.2e} audio {audio:.2e}")
        assert video <= MEAN_TOL and audio <= MEAN_TOL, (mesh, case, video, audio)
        np.testing.assert_array_equal(rank[(mesh, case)][0], results[0][(mesh, case)][0])


def test_paths_taken(results):
    """Steps 1 and 2 on the step path at both meshes; step 0 (learning) per call."""
    for mesh, case in CHECKS:
        _, steps = results[0][(mesh, case, "stats")]
        assert steps == dict(steps=STEPS - 1, answered=2 * (STEPS - 1), missed=0, dropped=0), (mesh, steps)


def test_passes_from_the_wrong_group_fail_the_tolerance(results, refs):
    """Negative control at cfg=4: the groups' buffers in reverse order (modality <-> uncond, STG <-> cond)."""
    video, audio = errors(results[0]["control"], refs["ltx2"])
    assert video > 100 * MEAN_TOL and audio > 100 * MEAN_TOL, (video, audio)
