"""`dtp serve --replicas 2 --cfg 2` on 4 gloo ranks works: each replica is a (cfg=2) mesh of 2 ranks, a slice of one
("replica", "cfg", "cp", "tp") mesh (`replicas.replica_mesh`), loaded by `open_pipeline(mesh=...)` as `dtp serve`
loads it. The two replicas run different requests at the same time (replica 0 one 32 x 32 request, replica 1 a
batch of two 16 x 16 ones, as `--max-batch` forms it), each with FLUX.1's true CFG (two transformer calls a step,
answered by the cfg exchange). Each output equals the one-process run of its request (fp32 pixels: mean |diff|
<= 1e-6, max <= 1e-5, as the cfg parity tests), both ranks of a replica hold the same pixels, and the cfg path was
taken (pairs answered by the exchange). A collective that spanned both replicas would pair different shapes and
fail or hang; the server over HTTP is tests/distributed/test_serve_replicas.py (tp, `full`).
"""

from __future__ import annotations

import numpy as np
import pytest

from dtp.families.pipelines import tiny_checkpoint
from dtp.pipeline.request import Request
from dtp.testing.launch import spawn
from dtp.testing.pixels import pixel_error

STEPS = 2
CFG = dict(negative_prompt="blurry", true_cfg_scale=4.0, steps=STEPS)
BATCHES = [  # replica -> the batch it runs
    [Request(prompt="a cat", seed=10, height=32, width=32, **CFG)],
    [
        Request(prompt="a dog", seed=11, height=16, width=16, **CFG),
        Request(prompt="a bird", seed=12, height=16, width=16, **CFG),
    ],
]
MEAN_TOL, MAX_TOL = 1e-6, 1e-5

# 4 ranks loading the tiny FLUX.1: 140 s on the busy 2-core machine (DTP_FULL=1)
pytestmark = pytest.mark.full


def _load(model_dir: str, mesh=None):
    import torch

    from dtp.pipeline.session import LoadOptions, open_pipeline

    options = LoadOptions(model_dir=model_dir, dtype="fp32", cfg=1 if mesh is None else 2)
    pipe = open_pipeline(options, torch.device("cpu"), distributed=mesh is not None, mesh=mesh)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def replica_job(rank: int, world: int, model_dir: str) -> dict:
    from dtp.runtime.cfg import CFG_ATTR
    from dtp.serve.batch import run_batch
    from dtp.serve.replicas import layout, replica_mesh

    size, tp = layout(world, 2, cp=1, cfg=2)
    mesh = replica_mesh("cpu", 2, cfg=2, cp=1, tp=tp)
    pipe = _load(model_dir, mesh)
    replica = rank // size
    generation = run_batch(pipe, BATCHES[replica])
    stats = vars(getattr(pipe.transformer, CFG_ATTR).stats).copy()
    ranks = mesh.mesh.flatten().tolist()
    return {"replica": replica, "ranks": ranks, "outputs": generation.outputs, "stats": stats}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(tiny_checkpoint("flux"))  # the shared cache: built once per machine, only read


def test_two_replicas_of_cfg_2_each_equal_one_process(checkpoint):
    from dtp.pipeline.generate import run_request

    results = spawn(replica_job, 4, checkpoint)
    assert [r["replica"] for r in results] == [0, 0, 1, 1]
    assert [r["ranks"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # each replica's own slice
    pipe = _load(checkpoint)
    for result in results:
        # the cfg path taken: replica 0's true-CFG pairs answered by the exchange (measured: 1 of 1 predicted);
        # replica 1's batch of 2 split over the cfg groups in both calls of each step (measured: 4)
        expected = {"hits": STEPS - 1, "batch": 0} if result["replica"] == 0 else {"hits": 0, "batch": 2 * STEPS}
        assert {k: result["stats"][k] for k in expected} == expected, result["stats"]
        requests = BATCHES[result["replica"]]
        assert len(result["outputs"]) == len(requests)
        for request, served in zip(requests, result["outputs"], strict=True):
            (reference,) = run_request(pipe, request).outputs
            mean, worst = pixel_error(np.asarray(served), np.asarray(reference))
            assert served.shape == reference.shape and mean <= MEAN_TOL and worst <= MAX_TOL, (request, mean, worst)
