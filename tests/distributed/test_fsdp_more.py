"""fsdp=True with regional torch.compile and diffusers' FirstBlockCache, on 2 gloo ranks (cp=2, one group).

(pad=True with fsdp needs tp > 1 next to cp: test_fsdp_pad_4.py.)
- compile: tiny FLUX.1 with one block of each kind, diffusers' `model.compile_repeated_blocks(fullgraph=True)`
  after sharding (it finds FSDP2's renamed block classes through the instance's `_repeated_blocks`), with dynamo's
  "eager" backend as in test_compile.py, against the same model run eagerly; the negative control edits a shard.
- FirstBlockCache via `pipe.transformer.enable_cache` on the tiny FLUX.1 pipeline with true CFG: the pixels and the
  blocks run of the one-process cached run. FSDP2's all-gather pre-hooks fire for a skipped block too; a rank that
  gathered where the other did not would hang, so the spawn timeout is the hang check.
"""

from __future__ import annotations

import os

import pytest
import torch
from cache_cases import FBC_THRESHOLD, SPLIT_THRESHOLD, UNCACHED, bodies, cached_run, config, generate
from fsdp_cases import TOL, in_flight, wrong_rank_shard

from dtp.pipeline.compare import compare
from dtp.testing.launch import spawn
from dtp.testing.scope import full_run
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"
ONE_BLOCK_EACH = dict(num_layers=1, num_single_layers=1)
TIMESTEPS = (0.9, 0.5)
# Dynamo's "eager" backend by default (seconds); inductor costs ~60 s per rank here (measured: rel 3.2e-7), so it
# runs only with DTP_COMPILE_MATRIX=full, as in test_compile.py.
BACKENDS = ("eager", "inductor") if os.environ.get("DTP_COMPILE_MATRIX") == "full" or full_run() else ("eager",)
MEAN_TOL = 1e-6  # mean |pixels - reference| on [0, 1]; measured 1.1e-7 (the per-rank-metric control: 1.8e-2)
# compile: measured rel 0.0 (the eager backend runs the same kernels); the wrong-shard control: 0.41


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 2, timeout_s=600)


def _worker(rank, world):
    import dtp

    mesh = dtp.make_mesh(cp=2)
    memory, decode = in_flight(mesh), {whole: _at_decode(mesh, whole) for whole in (True, False)}
    return dict(compile={b: _compiled(mesh, b) for b in BACKENDS}, fbc=_fbc_runs(mesh), memory=memory, decode=decode)


def _at_decode(mesh, pipeline: bool) -> dict:
    """The tiny FLUX.1 pipeline sharded with fsdp=True, whole (`parallelize_pipeline`, which frees the transformer's
    pending window before the VAE decodes) or its transformer alone (`parallelize`: the control, pending kept):
    what of the transformer is gathered or being gathered when the decoder starts."""
    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    pipe, seen = tiny_flux_pipeline(), {}
    if pipeline:
        dtp.parallelize_pipeline(pipe, mesh, fsdp=True)
    else:
        dtp.parallelize(pipe.transformer, mesh, fsdp=True)

    def probe(module, args):  # registered after the release hook: runs after it
        groups = [m._get_fsdp_state()._fsdp_param_group for m in pipe.transformer.modules() if is_fsdp_unit(m)]
        groups = [g for g in groups if g is not None]
        seen["pending"] = sum(g._all_gather_result is not None for g in groups)
        seen["gathered"] = sum(g.is_unsharded for g in groups)

    pipe.vae.decoder.register_forward_pre_hook(probe)
    generate(pipe)
    return seen


def is_fsdp_unit(module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@torch.no_grad()
def _compiled(mesh, backend: str) -> dict:
    import dtp
    from dtp.runtime.fsdp import LAYOUT_ATTR
    from dtp.runtime.parallelism import Parallelism

    torch._dynamo.reset()
    model = dtp.parallelize(tiny_model(FLUX, **ONE_BLOCK_EACH), mesh, fsdp=True)
    calls = [{**tiny_inputs(FLUX), "timestep": torch.tensor([t])} for t in TIMESTEPS]
    eager = [output_tensor(model(**x)).float() for x in calls]
    counters = torch._dynamo.utils.counters
    counters.clear()
    try:
        model.compile_repeated_blocks(fullgraph=True, backend=backend)  # diffusers' own regional compile
        compiled = [output_tensor(model(**x)).float() for x in calls]
    except Exception as error:  # noqa: BLE001 - reported: a refusal must be clear, on every rank
        return dict(error=" ".join(f"{type(error).__name__}: {error}".split())[:400])
    graphs, breaks = counters["stats"]["unique_graphs"], dict(counters["graph_break"])
    layout = getattr(model, LAYOUT_ATTR)  # the units apply_fsdp sharded: the split block's are its children
    units = [u.module for u in layout.units if u.path not in {v.inside for v in layout.units}]
    regions = sum(unit._compiled_call_impl is not None for unit in units)  # what compile() set on each unit
    # The negative control, through the compiled blocks: in the last block, which its forward reshards (the first
    # stays gathered between calls, prefetched by the last, so a shard edited now would not reach it).
    wrong_rank_shard(model.single_transformer_blocks, Parallelism(mesh, fsdp=True).fsdp_mesh)
    broken = output_tensor(model(**calls[0])).float()
    return dict(
        rel=max(float((c - e).abs().max() / e.abs().max()) for c, e in zip(compiled, eager)),
        broken_rel=float((broken - eager[0]).abs().max() / eager[0].abs().max()),
        graphs=graphs,
        breaks=breaks,
        regions=(regions, len(units)),
    )


def _fbc(mesh, before: bool = False, threshold: float = FBC_THRESHOLD) -> dict:
    """cache_cases.cached_run with fsdp=True: FirstBlockCache enabled after sharding (or before), blocks counted."""
    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    with bodies() as counts:
        pipe = tiny_flux_pipeline()
        if before:
            pipe.transformer.enable_cache(config("fbc", pipe, threshold))
        dtp.parallelize(pipe.transformer, mesh, fsdp=True)
        if not before:
            pipe.transformer.enable_cache(config("fbc", pipe, threshold))
        counts.clear()
        pixels = generate(pipe)
    return {"pixels": pixels, **counts}


def _fbc_runs(mesh) -> dict:
    """After and before sharding; at SPLIT_THRESHOLD with the metric global, then left per rank (the control)."""
    from diffusers.hooks._helpers import TransformerBlockRegistry
    from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

    from dtp.cache import scope

    out = dict(after=_fbc(mesh), before=_fbc(mesh, before=True), split=_fbc(mesh, threshold=SPLIT_THRESHOLD))
    real = scope.DecisionScope.split_groups
    scope.DecisionScope.split_groups = lambda self: []  # each rank's metric over its own tokens only
    try:
        out["per_rank"] = _fbc(mesh, threshold=SPLIT_THRESHOLD)
    finally:
        scope.DecisionScope.split_groups = real
    out["base_metadata_kept"] = TransformerBlockRegistry.get(FluxTransformerBlock)._cls is FluxTransformerBlock
    return out


def test_blocks_in_flight_as_fit_models_them(results):
    """fsdp's forward holds the running unit, its prefetch window and the gathered root above the activations
    (`runtime/fsdp.in_flight_bytes`, what `dtp fit` puts in the denoise phase), not a third window: FSDP2 by default
    keeps each unit's all-gather buffer until the next unit's copy-out (measured with a unit per block: 3.11 largest
    blocks above the activations by default, 2.11 with runtime/fsdp.py's async unshard, the root's gathered half
    included). The double blocks of this model (0.60 MB) are 2.4 x its single block, so they are split: measured
    527 kB above the activations = 0.81 x (in flight 497 kB + root 154 kB; in flight is the single block's copy-out,
    its buffer and parameters, 2 x 249 kB: 448 kB before it was counted); a unit per block held 2.11 x 0.60 MB."""
    for per_rank in results:
        m = per_rank["memory"]
        extra = m[True] - m[False]  # the same activations on both sides
        assert m["in_flight"] < extra <= 1.02 * (m["in_flight"] + m["root"]), m
        assert extra < m["largest"] + m["root"], m  # less than the old units' one block: the split blocks count


def test_pipeline_decodes_with_nothing_gathered(results):
    """`parallelize_pipeline(fsdp=True)`: when the VAE's decoder starts, no unit of the transformer is gathered or
    pending (`dtp fit`'s decode phase holds none); the transformer sharded alone keeps the first window its last
    call prefetched (the control: 2 units pending, the double block's AdaLN pair) and its gathered root."""
    for per_rank in results:
        freed, kept = per_rank["decode"][True], per_rank["decode"][False]
        assert freed == {"pending": 0, "gathered": 0}, freed
        assert kept["pending"] >= 1 and kept["gathered"] >= 1, kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_regional_compile_with_fsdp(results, backend):
    """diffusers' `compile_repeated_blocks(fullgraph=True)` on an fsdp model compiles every FSDP2 block (renamed
    `FSDP<Block>`: runtime/fsdp.name_repeated_blocks; the double block, split, as its 5 child units): no graph
    break, the eager model's output within 1e-5 relative; a shard from the wrong rank moves the compiled output (the
    gathers run inside the compiled calls)."""
    for rank in results:
        r = rank["compile"][backend]
        assert "error" not in r, r
        assert r["regions"][0] == r["regions"][1] == 6, r  # every unit, found under FSDP2's renamed classes
        assert r["graphs"] >= 1 and r["breaks"] == {} and r["rel"] <= TOL, r
        assert r["broken_rel"] > TOL, r


@pytest.fixture(scope="module")
def fbc_reference() -> dict:
    """The one-process FirstBlockCache run, computed once for both orders (suite time: ~2.7 CPU s a run)."""
    return cached_run("fbc")


@pytest.mark.parametrize("order", ["after", "before"])
def test_first_block_cache_with_fsdp(results, fbc_reference, order):
    """FirstBlockCache at cp=2 with fsdp, enabled after or before sharding: the one-process cached pixels
    (mean <= 1e-6) and the same blocks run, on every rank (a rank that gathered alone would hang: spawn's timeout)."""
    reference = fbc_reference
    assert reference["block"] < UNCACHED, reference["block"]  # the cache skips blocks on this run
    for rank in results:
        r = rank["fbc"][order]
        mean, p99, _ = compare(r["pixels"], reference["pixels"])
        assert mean <= MEAN_TOL, (mean, p99)
        assert r["block"] == reference["block"], (r["block"], reference["block"])
    assert all(rank["fbc"]["base_metadata_kept"] for rank in results)


def test_per_rank_metric_fails_without_hanging(results):
    """Negative control: FirstBlockCache's metric over each rank's own tokens under fsdp computes blocks one process
    skips and moves the pixels; the same run with the global metric matches one process."""
    reference = cached_run("fbc", threshold=SPLIT_THRESHOLD)
    split, control = results[0]["fbc"]["split"], results[0]["fbc"]["per_rank"]
    assert split["block"] == reference["block"] and compare(split["pixels"], reference["pixels"])[0] <= MEAN_TOL
    assert control["block"] != reference["block"]
    assert compare(control["pixels"], reference["pixels"])[0] > MEAN_TOL
