"""Bundled plans with colwise_gathered modulation: gloo parity at tp 2 and 4, and the exact collectives.

One spawn of 4 gloo processes serves both degrees: tp=4 on the whole world, tp=2 on the `tp` axis
of a (cp=2, tp=2) mesh (only its 1-D tp submesh is passed to parallelize, so no CP is involved).
"""

from collections import Counter

import pytest
import torch

from dtp.testing.launch import spawn
from dtp.testing.tiny import PLAN_CLASSES as ALL_PLAN_CLASSES

# The plans bundled before issue 10; the coverage plans' parity and collectives are checked in
# test_coverage_parity*.py (one spawn per degree), their loading there too (Wan's sharded norms).
PLAN_CLASSES = {name: ALL_PLAN_CLASSES[name] for name in ("flux", "flux2", "qwenimage", "zimage")}

TOLERANCE = 1e-5  # max |sharded - ref| <= TOLERANCE * max |ref|, fp32
BATCH, IMG_TOKENS, TXT_TOKENS = 2, 16, 8  # batch 2: the gather must be along features, not batch
CASES = [(plan, cls, tp) for plan, cls in sorted(PLAN_CLASSES.items()) for tp in (2, 4)]


def _rank_job(rank: int, world_size: int) -> dict:
    import dtp
    from dtp.analysis.collectives import CollectiveCounter, implied_collectives
    from dtp.resolve import resolve
    from dtp.runtime.mesh import tp_submesh
    from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

    meshes = {4: tp_submesh(dtp.make_mesh(tp=4)), 2: tp_submesh(dtp.make_mesh(tp=2, cp=2))}
    results = {}
    for plan_name, class_name in sorted(PLAN_CLASSES.items()):
        inputs = tiny_inputs(class_name, batch=BATCH, img_tokens=IMG_TOKENS, txt_tokens=TXT_TOKENS)
        with torch.no_grad():
            ref = output_tensor(tiny_model(class_name)(**inputs)).float()
        for tp, mesh in meshes.items():
            plan, model = dtp.load_plan(plan_name), tiny_model(class_name)
            resolved = resolve(plan, model)
            dtp.parallelize(model, mesh, plan)
            with torch.no_grad(), CollectiveCounter(model) as counter:
                out = output_tensor(model(**inputs)).float()
            results[(plan_name, tp)] = {
                "rel": float((out - ref).abs().max() / ref.abs().max()),
                "measured": {scope: dict(counter.counts(scope)) for scope in {r.scope for r in counter.records}},
                "implied": {scope: dict(c) for scope, c in implied_collectives(resolved, model).items()},
                "gather_bytes": Counter(r.bytes for r in counter.records if r.op == "all_gather_into_tensor"),
                "expected_gather_bytes": Counter(
                    _gathered_bytes(spec, model) for spec in resolved.linears if spec.style.gathers_output
                ),
                "num_gathered": sum(spec.style.gathers_output for spec in resolved.linears),
            }
    return results


def _gathered_bytes(spec, model) -> int:
    """The full output of a gathered Linear in fp32: per-sample vectors, except the text embedder."""
    out_features = model.get_submodule(spec.path).out_features
    rows = BATCH * TXT_TOKENS if spec.path == "context_embedder" else BATCH
    return rows * out_features * 4


@pytest.fixture(scope="module")
def results():
    return spawn(_rank_job, 4)


@pytest.mark.parametrize("plan_name, class_name, tp", CASES)
def test_parity(results, plan_name, class_name, tp):
    """Tiny model, bundled plan with gathered modulation: max |sharded - ref| <= 1e-5 max |ref| on every rank."""
    rels = [rank[(plan_name, tp)]["rel"] for rank in results]
    assert max(rels) <= TOLERANCE, rels


@pytest.mark.parametrize("plan_name, class_name, tp", CASES)
def test_collectives_per_block_are_what_the_plan_implies(results, plan_name, class_name, tp):
    """One all-reduce per rowwise Linear and one all-gather per gathered Linear, in each block, nothing else."""
    case = results[0][(plan_name, tp)]
    assert case["num_gathered"] > 0  # the bundled plan does use the style
    assert case["measured"] == case["implied"]
    assert case["gather_bytes"] == case["expected_gather_bytes"]
    assert all(rank[(plan_name, tp)]["measured"] == case["measured"] for rank in results)
