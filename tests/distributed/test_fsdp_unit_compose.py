"""fsdp=2 (grouped FSDP2 units, `runtime/fsdp_unit.py`) with diffusers' block caches, dtp.load_lora and
shard-on-load on (cp=2, tp=2) (TP inside, FSDP over the cp pair), and alone on (cfg=2, cp=2); 4 gloo ranks, one
group, against one process. Default tier: FirstBlockCache, its control, shard-on-load; the rest with DTP_FULL=1.

At fsdp=2 tiny FLUX.1's 2 double blocks are one unit and its 2 single blocks another: `fully_shard([b0, b1])`
gathers before b0 and reshards after b1 (torch's group hooks count the blocks' `__call__`s).
- cache: FirstBlockCache enabled after sharding, 5 steps with true CFG (cache_cases). A skipped block's `__call__`
  still runs (diffusers replaces its forward), so the group's post-hook fires and the group reshards. Checked after
  every transformer call: no non-root unit unsharded (FSDP2's param-group state) and every block parameter back at
  its sharded local size. Control: one group with `reshard_after_forward=False` (a group left gathered) fails it.
  Full tier: the cache enabled before sharding, and MagCache (FLUX's ratios: whole calls skipped, a group's first
  block included).
- LoRA: lora_cases' adapter sequence (load, weighted pair, fuse, unfuse, disable, enable, delete) at fsdp=2
  against diffusers' `load_lora_adapter`; control: fuse with `release` replaced by per-unit reshards.
- shard-on-load: `loading.load(..., fsdp=2)` against `dtp.parallelize(from_pretrained, fsdp=2)`: same units, equal
  local shards, parity, reads <= 1.1 x the share.
- (cfg=2, cp=2): fsdp=2 over the 4 ranks flattened (batch 2 split over the cfg groups).
Measured (19:31 UTC, load 1-3): FBC mean 1.2e-7, 31 of 40 blocks run, nothing left gathered after any of the 10
calls; control: 1 unit and 28 parameters whole; MagCache mean 1.6e-7, 16 of 40 blocks run (as one process), nothing
left gathered; load 4.0e-7, read = share; LoRA <= 8.4e-7, control 0.22; cfg 5.0e-7.
CPU (19:34, load 3-4): default tier 1.4 s a rank (5.5 s for 4) + 0.4 s in the test process (the one-process FBC run,
once diffusers' pipeline modules are imported: 6.4 s the first time in a session); DTP_FULL=1 3.45 s a rank.
"""

from __future__ import annotations

import time

import pytest
import torch
from cache_cases import UNCACHED, any_config, bodies, cached_run, generate
from fsdp_cases import TOL, inputs_for, parity
from lora_cases import fuse, random_lora, reference_load, relative, sharded_load, steps

from dtp.pipeline.compare import compare
from dtp.testing.launch import spawn
from dtp.testing.scope import full_run
from dtp.testing.tiny import model_class, output_tensor, tiny_model

FLUX = "FluxTransformer2DModel"
UNIT = 2
MESH, CFG = dict(cp=2, tp=2), dict(cfg=2, cp=2)
GROUPS = [("transformer_blocks.0", 2), ("single_transformer_blocks.0", 2)]  # fsdp=2 on tiny FLUX.1
MEAN_TOL = 1e-6  # mean |pixels - one process| on [0, 1], as test_fsdp_more's FirstBlockCache
READ_SLACK = 1.1


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("unit-load") / "flux"
    tiny_model(FLUX).save_pretrained(path)
    return spawn(_worker, 4, str(path), timeout_s=600)


def _worker(rank, world, path):
    import dtp

    mesh = dtp.make_mesh(**MESH)
    out = dict(fbc=_cached(mesh), control=_left_gathered(mesh), load=_load(mesh, path))
    if full_run():
        out["fbc_before"] = _cached(mesh, before=True)
        out["mag"] = _cached(mesh, name="mag")
        out["lora"] = steps(_sharded(mesh), sharded_load, inputs_for(FLUX, MESH))
        out["lora_control"] = _fused_without_release(mesh)
        out["cfg"] = parity(FLUX, dtp.make_mesh(**CFG), CFG, fsdp=UNIT)
        out["cfg_units"] = _groups(_sharded(dtp.make_mesh(**CFG)))
    out["cpu_s"] = time.process_time()  # the rank's CPU since the forkserver forked it (for the tier's budget)
    return out


def _sharded(mesh):
    import dtp

    return dtp.parallelize(tiny_model(FLUX), mesh, fsdp=UNIT)


def _groups(model) -> list[tuple[str, int]]:
    from dtp.runtime.fsdp import LAYOUT_ATTR

    return [(u.path, 1 + len(u.members)) for u in getattr(model, LAYOUT_ATTR).gathered()]


def block_sizes(model) -> list[int]:
    """This rank's elements of each block parameter as registered now: its FSDP shard of its tp slice between calls,
    the whole tp slice while its unit is gathered."""
    from torch.distributed.tensor import DTensor

    from dtp.runtime.fsdp import block_lists

    params = [p for _, lst in block_lists(model) for b in lst for p in b.parameters()]
    return [(p.to_local() if isinstance(p, DTensor) else p).numel() for p in params]


def left_gathered(model, sharded: list[int]) -> dict:
    """What of `model`'s units (not its root, which FSDP keeps gathered between calls) is not back to its shards:
    unsharded param groups (FSDP2's state, one per unit however many blocks it groups) and block parameters larger
    than their shard (`sharded`: `block_sizes` right after sharding)."""
    from torch.distributed.fsdp import FSDPModule

    root = model._get_fsdp_state()
    states = {id(s): s for m in model.modules() if isinstance(m, FSDPModule) for s in [m._get_fsdp_state()]}
    groups = [s._fsdp_param_group for s in states.values() if s is not root and s._fsdp_param_group is not None]
    return dict(
        units=len(groups),
        unsharded=sum(g.is_unsharded for g in groups),
        whole=sum(now > at_rest for now, at_rest in zip(block_sizes(model), sharded, strict=True)),
    )


def _watch(model) -> list[dict]:
    """`left_gathered` after each call of `model` (a post-hook registered after FSDP2's root hook: runs after it)."""
    seen, sharded = [], block_sizes(model)
    model.register_forward_hook(lambda module, args, output: seen.append(left_gathered(module, sharded)))
    return seen


def _cached(mesh, before: bool = False, name: str = "fbc") -> dict:
    """FirstBlockCache (or MagCache, `name="mag"`: FLUX's ratios) enabled after sharding with fsdp=2
    (cache_cases.cached_run's order), or before; `mesh` None: one process. Pixels, blocks run, and what each
    transformer call left gathered."""
    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    with bodies() as counts:
        pipe = tiny_flux_pipeline()
        if before:
            pipe.transformer.enable_cache(any_config(name, pipe))
        if mesh is not None:
            dtp.parallelize(pipe.transformer, mesh, fsdp=UNIT)
        if not before:
            pipe.transformer.enable_cache(any_config(name, pipe))
        seen = _watch(pipe.transformer) if mesh is not None else []
        counts.clear()
        pixels = generate(pipe)
    groups = _groups(pipe.transformer) if mesh is not None else []
    return dict(pixels=pixels, block=counts["block"], after=seen, groups=groups)


@torch.no_grad()
def _left_gathered(mesh) -> list[dict]:
    """Control: the single-block group set to stay gathered after its forward (as a group whose last block never
    reached its post-hook would): two calls, what each left."""
    from dtp.testing.tiny import tiny_inputs

    model = _sharded(mesh)
    model.single_transformer_blocks[0].set_reshard_after_forward(False)
    seen = _watch(model)
    for _ in range(2):
        model(**tiny_inputs(FLUX))
    return seen


@torch.no_grad()
def _fused_without_release(mesh) -> torch.Tensor:
    """Adapter "a" fused at 0.5 after a call, `release` replaced by each unit's reshard(): the first window's gather,
    prefetched by the last unit, stays pending with the unfused weights (test_fsdp_lora's control, at fsdp=2)."""

    import dtp

    model, inputs = _sharded(mesh), inputs_for(FLUX, MESH)
    dtp.load_lora(model, random_lora(model, seed=10), adapter_name="a")
    model(**inputs)
    fuse(model, 0.5, release_broken=True)
    return output_tensor(model(**inputs)).clone()


@torch.no_grad()
def _load(mesh, path) -> dict:
    """Shard-on-load at fsdp=2 against the whole model sharded by dtp.parallelize at fsdp=2."""
    from torch.distributed.tensor import DTensor

    import dtp
    from dtp.loading.load import load
    from dtp.testing.tiny import tiny_inputs

    def local(p):
        return p.to_local() if isinstance(p, DTensor) else p

    inputs, cls = tiny_inputs(FLUX), model_class(FLUX)
    ref = output_tensor(cls.from_pretrained(path).eval()(**inputs)).float()
    model, stats = load(cls, path, mesh, fsdp=UNIT)
    theirs = dict(dtp.parallelize(cls.from_pretrained(path).eval(), mesh, fsdp=UNIT).named_parameters())
    mine = dict(model.named_parameters())
    out = output_tensor(model(**inputs)).float()
    return dict(
        diff=float((out - ref).abs().max()),
        ref=float(ref.abs().max()),
        groups=_groups(model),
        names_equal=sorted(mine) == sorted(theirs),
        unequal=[n for n in theirs if not torch.equal(local(mine[n]), local(theirs[n]))],
        read=stats.bytes_read,
        share=stats.share_bytes,
    )


@pytest.fixture(scope="module")
def fbc_reference() -> dict:
    return cached_run("fbc")


@pytest.mark.parametrize(
    "key",
    ["fbc", pytest.param("fbc_before", marks=pytest.mark.full), pytest.param("mag", marks=pytest.mark.full)],
)
def test_block_cache_with_grouped_units(results, fbc_reference, key):
    """FirstBlockCache at fsdp=2, enabled after sharding (or before; or MagCache: full): the one-process cached pixels
    (mean <= 1e-6) and the same blocks run (fewer than uncached); after every transformer call (10) no unit left
    gathered, no block parameter left whole."""
    reference = fbc_reference if key != "mag" else _cached(None, name="mag")
    assert reference["block"] < UNCACHED, reference["block"]
    for r in (per_rank[key] for per_rank in results):
        assert r["groups"] == GROUPS, r["groups"]
        mean, p99, _ = compare(r["pixels"], reference["pixels"])
        assert mean <= MEAN_TOL and r["block"] == reference["block"], (mean, p99, r["block"], reference["block"])
        assert len(r["after"]) == 10 and all(a == dict(units=2, unsharded=0, whole=0) for a in r["after"]), r["after"]


def test_a_group_left_gathered_fails_the_check(results):
    """Negative control: the single-block group kept gathered shows as 1 unsharded unit and its 2 blocks' parameters
    whole, after each call."""
    for per_rank in results:
        for seen in per_rank["control"]:
            assert seen["unsharded"] == 1 and seen["whole"] > 0, per_rank["control"]


def test_shard_on_load_with_grouped_units(results):
    """`load(..., fsdp=2)`: the asked groups, every local shard equal to dtp.parallelize's at fsdp=2, parity <= 1e-5
    x max |ref|, bytes read <= 1.1 x the share."""
    for r in (per_rank["load"] for per_rank in results):
        assert r["groups"] == GROUPS, r["groups"]
        assert r["names_equal"] and r["unequal"] == [], r["unequal"][:5]
        assert r["diff"] <= TOL * r["ref"], r
        assert r["read"] <= READ_SLACK * r["share"], r


@pytest.mark.full  # the adapter sequence: 8 forwards and 2 loads per rank, and the one-process sequence here
def test_lora_with_grouped_units(results):
    """lora_cases' adapter sequence at fsdp=2 on (cp=2, tp=2): each step <= 1e-5 x max |ref| of diffusers + peft."""
    ref = steps(tiny_model(FLUX), reference_load, inputs_for(FLUX, MESH))
    for per_rank in results:
        rel = relative(per_rank["lora"], ref)
        assert max(rel.values()) <= TOL, rel


@pytest.mark.full
def test_fuse_without_release_fails(results):
    """Negative control: fuse after per-unit reshards, the pending first-window gather kept: off the reference."""
    model = tiny_model(FLUX)
    model.load_lora_adapter(random_lora(model, seed=10), adapter_name="a", prefix="transformer")
    model.fuse_lora(lora_scale=0.5)
    with torch.no_grad():
        ref = output_tensor(model(**inputs_for(FLUX, MESH)))
    for per_rank in results:
        assert relative({"x": per_rank["lora_control"]}, {"x": ref})["x"] > 100 * TOL


@pytest.mark.full
def test_cfg_mesh_with_grouped_units(results):
    """fsdp=2 over (cfg=2, cp=2) (batch 2): the asked groups, both calls within 1e-5 x max |ref|."""
    for per_rank in results:
        r = per_rank["cfg"]
        assert per_rank["cfg_units"] == GROUPS and r["shape_ok"], per_rank["cfg_units"]
        assert r["diff"] <= TOL * r["ref"] and r["again"] <= TOL * r["ref"], r
