"""dtp.load_lora on models sharded with fsdp=True, on 4 gloo ranks (one process group), against diffusers + peft on
one process.

Tiny FLUX.1 (packed rowwise `proj_out`, gathered AdaLN, adapted root layers: `x_embedder`, `proj_out`) on
(cp=2, tp=2) (TP inside, FSDP across the cp ranks) and on (cfg=2, cp=2) (tp=1, FSDP over the 4 ranks flattened),
through lora_cases' sequence: load, a second adapter with `set_adapters` weights, fuse at 0.5 (safe_fusing on the
second mesh), unfuse, disable / enable, delete. Each step runs a forward first, so the fuse meets the state FSDP
leaves after a call (the root gathered, the first window's gather pending); a fuse before the first call too.
Negative control: fusing after resharding each unit without dropping the pending gather (a plausible `release`)
leaves the first window unfused. Also: the same LoRA on (cp=2, tp=2) without fsdp (cp's hooks on adapted layers).
"""

from __future__ import annotations

import pytest
import torch
from fsdp_cases import FLUX, inputs_for, tag
from lora_cases import fuse, random_lora, reference_load, relative, sharded_load, steps

from dtp.testing.launch import spawn
from dtp.testing.tiny import output_tensor, tiny_model

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32; measured <= 8.0e-7 (cp=2 x tp=2), 6.9e-7 (cfg=2 x cp=2)
MESHES = (dict(cp=2, tp=2), dict(cfg=2, cp=2))
CONTROL = MESHES[0]


def _worker(rank, world):
    import dtp

    out = {}
    for dims in MESHES:
        model = dtp.parallelize(tiny_model(FLUX), dtp.make_mesh(**dims), fsdp=True)
        out[tag(dims)] = steps(model, sharded_load, inputs_for(FLUX, dims), safe_fusing=dims.get("cfg") == 2)
        out[(tag(dims), "bytes")] = _adapter_bytes(model)
    out["control"] = _fused(before_a_call=False, release_broken=True)
    out["fuse_first"] = _fused(before_a_call=True, release_broken=False)
    out["bias"] = _bias_refusal(dtp.make_mesh(**CONTROL))
    out["cp_without_fsdp"] = _adapted_without_fsdp()
    return out


def _adapter_bytes(model) -> int:
    """This rank's bytes of adapter "b" (lora_cases' seed 11)."""
    from torch.distributed.tensor import DTensor

    return sum(
        (p.to_local() if isinstance(p, DTensor) else p).nbytes for n, p in model.named_parameters() if ".b." in n
    )


@torch.no_grad()
def _fused(before_a_call: bool, release_broken: bool) -> torch.Tensor:
    """Adapter "a" fused at 0.5 on a fresh model, before its first call or after one, then a forward. Broken:
    `release` replaced by each unit's reshard(), so the first window's gather, prefetched by the last unit, stays
    pending with the unfused weights (the negative control)."""

    import dtp

    model = dtp.parallelize(tiny_model(FLUX), dtp.make_mesh(**CONTROL), fsdp=True)
    inputs = inputs_for(FLUX, CONTROL)
    dtp.load_lora(model, random_lora(model, seed=10), adapter_name="a")
    if not before_a_call:
        model(**inputs)
    fuse(model, 0.5, release_broken)
    return output_tensor(model(**inputs)).clone()


@torch.no_grad()
def _adapted_without_fsdp() -> torch.Tensor:
    """Adapter "a" on the same mesh without fsdp: cp's gather of `proj_out` must take peft's sum there too."""
    import dtp

    model = dtp.parallelize(tiny_model(FLUX), dtp.make_mesh(**CONTROL))
    dtp.load_lora(model, random_lora(model, seed=10), adapter_name="a")
    return output_tensor(model(**inputs_for(FLUX, CONTROL))).clone()


def _bias_refusal(mesh) -> str:
    import dtp

    model = dtp.parallelize(tiny_model(FLUX), mesh, fsdp=True)
    lora = random_lora(model, seed=10)
    lora["transformer.x_embedder.lora_B.bias"] = torch.zeros(model.x_embedder.out_features)
    try:
        dtp.load_lora(model, lora, adapter_name="a")
    except dtp.PlanError as error:
        return str(error) + f" | adapters after: {sorted(getattr(model, 'peft_config', {}))}"
    return "no error"


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 4)


@pytest.fixture(scope="module")
def references():
    return {tag(dims): steps(tiny_model(FLUX), reference_load, inputs_for(FLUX, dims)) for dims in MESHES}


@pytest.mark.parametrize("dims", MESHES, ids=tag)
def test_adapter_steps_match_one_process(results, references, dims):
    """Every step's output within 1e-5 x max |ref| on every rank, and each adapted step moves the reference."""
    ref = references[tag(dims)]
    for rank, per_rank in enumerate(results):
        rel = relative(per_rank[tag(dims)], ref)
        assert max(rel.values()) <= TOL, (rank, rel)
    moved = relative({k: ref[k] for k in ref}, {k: ref["base"] for k in ref})
    assert all(moved[k] > 1e-2 for k in ref if k not in ("base", "disabled")), moved


@pytest.mark.parametrize("dims", MESHES, ids=tag)
def test_adapters_whole_over_fsdp_split_over_tp(results, dims):
    """An adapter is replicated over the fsdp ranks (FSDP leaves it out of its units) and split over tp like its
    base: whole on every rank at tp=1; at tp=2 between half and whole (one factor of each pair split)."""
    whole = sum(t.nbytes for t in random_lora(tiny_model(FLUX), seed=11).values())
    for per_rank in results:
        local = per_rank[(tag(dims), "bytes")]
        assert (whole / 2 < local < whole) if dims.get("tp", 1) > 1 else (local == whole), (dims, local, whole)


def test_negative_control_stale_prefetch_fails(results, references):
    """Resharding without dropping the pending first-block gather: the fused output leaves the tolerance."""
    ref = references[tag(CONTROL)]["fused a x0.5"]
    for per_rank in results:
        assert relative({"x": per_rank["control"]}, {"x": ref})["x"] > 100 * TOL


def test_fuse_before_the_first_call(results, references):
    """Fused before FSDP2's lazy init (no call yet, nothing gathered): the one-process fused output."""
    ref = references[tag(CONTROL)]["fused a x0.5"]
    for per_rank in results:
        assert relative({"x": per_rank["fuse_first"]}, {"x": ref})["x"] <= TOL


def test_cp_hooks_apply_to_the_adapted_sum_without_fsdp(results, references):
    """(cp=2, tp=2) without fsdp: an adapted FLUX.1 (its `proj_out` gathered by cp) gives the one-process output."""
    ref = references[tag(CONTROL)]["a"]
    for per_rank in results:
        assert relative({"x": per_rank["cp_without_fsdp"]}, {"x": ref})["x"] <= TOL


def test_lora_bias_refused_before_loading(results):
    """A LoRA with lora_B.bias on an fsdp model: PlanError naming the key and the fix; no adapter loaded."""
    for per_rank in results:
        message = per_rank["bias"]
        for words in ("x_embedder.lora_B.bias", "fsdp=True", "fsdp=False", "adapters after: []"):
            assert words in message, message
