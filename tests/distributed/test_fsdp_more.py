"""fsdp=True with pad=True, regional torch.compile and diffusers' FirstBlockCache, on 2 gloo ranks (cp=2, one group).

- pad: tiny FLUX.1 with 3 heads, which Ulysses at cp=2 cannot split; pad=True zero-pads them to 4 (tp * cp) and
  FSDP2 shards the padded weights. Against diffusers' unsharded 3-head model; without pad: PlanError.
- compile: tiny FLUX.1 with one block of each kind, `torch.compile` on each block after sharding (diffusers'
  `compile_repeated_blocks`, dynamo's "eager" backend as in test_compile.py), against the same model run eagerly.
- FirstBlockCache via `pipe.transformer.enable_cache` on the tiny FLUX.1 pipeline with true CFG: the pixels and the
  blocks run of the one-process cached run. FSDP2's all-gather pre-hooks fire for a skipped block too; a rank that
  gathered where the other did not would hang, so the spawn timeout is the hang check.
"""

from __future__ import annotations

import pytest
import torch
from cache_cases import UNCACHED, bodies, cached_run, config, generate
from fsdp_cases import TOL

from dtp.testing.launch import spawn
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model
from dtp.tools.demo import compare

FLUX = "FluxTransformer2DModel"
ONE_BLOCK_EACH = dict(num_layers=1, num_single_layers=1)
TIMESTEPS = (0.9, 0.5)
MEAN_TOL = 1e-6  # mean |pixels - reference| on [0, 1]


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 2, timeout_s=600)


def _worker(rank, world):
    import dtp

    mesh = dtp.make_mesh(cp=2)
    return dict(compile=_compiled(mesh), fbc=_fbc(mesh))


@torch.no_grad()
def _compiled(mesh) -> dict:
    import dtp
    from dtp.runtime.fsdp import block_lists

    torch._dynamo.reset()
    model = dtp.parallelize(tiny_model(FLUX, **ONE_BLOCK_EACH), mesh, fsdp=True)
    calls = [{**tiny_inputs(FLUX), "timestep": torch.tensor([t])} for t in TIMESTEPS]
    eager = [output_tensor(model(**x)).float() for x in calls]
    counters = torch._dynamo.utils.counters
    counters.clear()
    try:
        for _, blocks in block_lists(model):
            for block in blocks:
                block.compile(backend="eager")
        compiled = [output_tensor(model(**x)).float() for x in calls]
    except Exception as error:  # noqa: BLE001 - reported: a refusal must be clear, on every rank
        return dict(error=" ".join(f"{type(error).__name__}: {error}".split())[:400])
    return dict(
        rel=max(float((c - e).abs().max() / e.abs().max()) for c, e in zip(compiled, eager)),
        graphs=counters["stats"]["unique_graphs"],
        breaks=dict(counters["graph_break"]),
    )


def _fbc(mesh) -> dict:
    """cache_cases.cached_run with fsdp=True: FirstBlockCache enabled after sharding, blocks counted."""
    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    with bodies() as counts:
        pipe = tiny_flux_pipeline()
        dtp.parallelize(pipe.transformer, mesh, fsdp=True)
        pipe.transformer.enable_cache(config("fbc", pipe))
        counts.clear()
        pixels = generate(pipe)
    return {"pixels": pixels, **counts}


def test_regional_compile_with_fsdp(results):
    """compile_repeated_blocks on an FSDP2-sharded model: the eager model's output within 1e-5 relative."""
    for rank in results:
        r = rank["compile"]
        assert "error" not in r, r
        assert r["graphs"] >= 1 and r["rel"] <= TOL, r


def test_first_block_cache_with_fsdp(results):
    """FirstBlockCache at cp=2 with fsdp: the one-process cached pixels (mean <= 1e-6) and the same blocks run."""
    reference = cached_run("fbc")
    assert reference["block"] < UNCACHED, reference["block"]  # the cache skips blocks on this run
    for rank in results:
        r = rank["fbc"]
        mean, p99, _ = compare(r["pixels"], reference["pixels"])
        assert mean <= MEAN_TOL, (mean, p99)
        assert r["block"] == reference["block"], (r["block"], reference["block"])
