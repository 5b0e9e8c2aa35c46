"""Worker side of the pipeline-level compile matrix: the tiny FLUX.1 pipeline loaded sharded by
`dtp.load_pipeline(..., compile="eager")` (regional, `fullgraph=True`, dynamo's eager backend) on 2 gloo ranks, one
generation of `STEPS` denoising steps, against the same pipeline loaded without `compile`.

Per case: the graphs dynamo compiled during step 1, those compiled after it (recompiles), the graph breaks
(`runtime.compile.CompileWatch`, the figures `dtp run --report` prints) and max |compiled - eager| of the fp32 pixels.
Used by tests/distributed/test_compile_pipeline.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

import dtp
from dtp.pipeline.generate import run_request
from dtp.pipeline.request import Request

STEPS = 3
# name -> (make_mesh degrees, load_pipeline options); 2 ranks each
CASES = {
    "tp": (dict(tp=2), {}),
    "cp-ulysses": (dict(cp=2), {}),
    "cp-ring": (dict(cp=2), dict(cp_mode="ring")),  # P2P K/V rotation: compile_blocks turns dynamo's P2P switch on
    "cfg": (dict(cfg=2), {}),  # true CFG: the two calls of a step on the two cfg groups (runtime/cfg)
    "fsdp": (dict(cp=2), dict(fsdp=True)),  # FSDP2 units compiled between their hooks (fsdp.name_repeated_blocks)
}
REQUEST = Request(prompt="a red cube", seed=0, steps=STEPS, height=32, width=32)
TRUE_CFG = dict(negative_prompt="blurry", true_cfg_scale=2.0)  # two transformer calls per step


def request_for(case: str) -> Request:
    return replace(REQUEST, **TRUE_CFG) if case == "cfg" else REQUEST


def pipeline_case(case: str, model_dir: str) -> dict:
    """One case on this rank: {graphs, recompiles, graph_breaks, max_diff}."""
    degrees, options = CASES[case]
    torch._dynamo.reset()
    mesh = dtp.make_mesh(**degrees)
    load = dict(torch_dtype=torch.float32, **options)
    eager = run_request(dtp.load_pipeline(model_dir, mesh, **load), request_for(case)).outputs[0]
    generation = run_request(dtp.load_pipeline(model_dir, mesh, compile="eager", **load), request_for(case))
    diff = float(np.abs(generation.outputs[0].astype(np.float64) - eager).max())
    return {**generation.compile, "max_diff": diff}


def run_cases(rank: int, world_size: int, cases: list[str], model_dir: str) -> dict:
    """Every case of `cases` on this rank; a case that raises is {"error": its first line} (the next still runs)."""
    results = {}
    for case in cases:
        try:
            results[case] = pipeline_case(case, model_dir)
        except Exception as error:  # noqa: BLE001 - reported per case; every rank fails the same way
            results[case] = {"error": " ".join(f"{type(error).__name__}: {error}".split())[:600]}
    return results
