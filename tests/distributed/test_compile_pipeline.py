"""Regional compile at pipeline level: the tiny FLUX.1 pipeline loaded by `dtp.load_pipeline(..., compile="eager")`
on 2 gloo ranks (one spawned group), 3 denoising steps, on every mesh kind: tp=2, Ulysses cp=2, ring cp=2, cfg=2
(true CFG: the two calls of a step on the two groups) and FSDP over cp=2.

Every case: 0 graph breaks (`fullgraph=True` would raise at one), the graphs all compiled in step 1 and none after it
(0 recompiles in steps 2-3), pixels within 1e-5 of the same pipeline loaded without `compile` (measured: equal, 0).
Dynamo's "eager" backend traces exactly what inductor would, without generating code. Ring compiles through
dynamo's P2P switch today (`compile_blocks(ring=True)`), until its K/V rotation moves to functional collectives.
Each case is an eager and a compiled generation with a cold trace (the five: ~10 min wall on the shared 2-core
machine, in three launches), so all are `full`; the
default run compiles through `dtp run --compile` at tp=2 (test_compile_run.py). The counters' negative control:
tests/unit/test_compile_regions.py (a recompile and a break are seen).
"""

from __future__ import annotations

import pytest
from compile_pipeline_cases import CASES, run_cases

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.launch import spawn

TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    return spawn(run_cases, 2, list(CASES), str(tiny_checkpoint("flux")), timeout_s=3600)


@pytest.mark.full
@pytest.mark.parametrize("case", list(CASES))
def test_pipeline_compiles_once_without_breaks(results, case):
    for rank, per_rank in enumerate(results):
        r = per_rank[case]
        assert "error" not in r, (rank, r["error"])
        assert r["graph_breaks"] == 0 and r["graphs"] >= 1 and r["recompiles"] == 0, (rank, r)
        assert r["max_diff"] <= TOL, (rank, r)
