"""dtp.from_pretrained on 4 gloo processes: parity with diffusers' own load, bytes read, no weight collective.

One process group for the whole module: on world size 4, tp=4 is a (cp=1, tp=4) mesh and tp=2 a
(cp=2, tp=2) mesh (each cp row loads and runs its own tp=2 copy). Every bundled plan is loaded
from a single-file and a multi-file checkpoint of its tiny config, saved by diffusers (by default each plan, layout
and mesh once: `DEFAULT`; every combination with DTP_FULL=1).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import dtp
from dtp.analysis.collectives import CollectiveCounter
from dtp.loading.load import load
from dtp.styles import full_tensor
from dtp.testing.launch import spawn
from dtp.testing.scope import full_run
from dtp.testing.tiny import PLAN_CLASSES as ALL_PLAN_CLASSES
from dtp.testing.tiny import model_class, output_tensor, tiny_inputs, tiny_model

LAYOUTS = {"single": None, "multi": "40KB"}  # max_shard_size for save_pretrained (None: one file)
MESHES = {2: dict(tp=2, cp=2), 4: dict(tp=4, cp=1)}
# The plans bundled before issue 10; the coverage plans are loaded in test_coverage_parity.py
# (Wan, whose sharded QK-norm weights go through the loader too).
PLAN_CLASSES = {name: ALL_PLAN_CLASSES[name] for name in ("flux", "flux2", "qwenimage", "zimage")}
TOLERANCE = 1e-5
CASES = [(plan, layout, tp) for plan in PLAN_CLASSES for layout in LAYOUTS for tp in MESHES]
# By default every plan single-file at tp=4 (its packed layouts reassembled) and FLUX.2 multi-file at tp=2 x cp=2: each
# plan, layout and mesh once; the other 11 of the 16 repeat a covered kind and run with DTP_FULL=1.
DEFAULT = [(plan, "single", 4) for plan in PLAN_CLASSES] + [("flux2", "multi", 2)]
RUN = CASES if full_run() else DEFAULT


def _save_checkpoints(root) -> dict:
    dirs = {}
    for plan_name, class_name in PLAN_CLASSES.items():
        model = tiny_model(class_name)
        for layout, shard_size in LAYOUTS.items():
            path = root / f"{plan_name}-{layout}"
            kwargs = {"max_shard_size": shard_size} if shard_size else {}
            model.save_pretrained(path, safe_serialization=True, **kwargs)
            dirs[(plan_name, layout)] = str(path)
    return dirs


@torch.no_grad()
def _worker(rank, world_size, dirs):
    meshes = {tp: dtp.make_mesh(device_type="cpu", **shape) for tp, shape in MESHES.items()}
    results = {"control": _control_count(meshes[4])}
    for plan_name, class_name in PLAN_CLASSES.items():
        cls, inputs = model_class(class_name), tiny_inputs(class_name)
        # Both layouts hold the same weights: one unsharded reference per plan, loaded by diffusers.
        reference_model = cls.from_pretrained(dirs[(plan_name, "single")]).eval()
        reference = output_tensor(reference_model(**inputs)).float()
        for (layout, path), (tp, mesh) in itertools.product(_layouts(dirs, plan_name), meshes.items()):
            if (plan_name, layout, tp) not in RUN:
                continue
            with CollectiveCounter() as counter:
                model, stats = load(cls, path, mesh, dtp.load_plan(plan_name))
            out = output_tensor(model(**inputs)).float()
            results[(plan_name, layout, tp)] = dict(
                diff=float((out - reference).abs().max()),
                ref=float(reference.abs().max()),
                collectives=[c.op for c in counter.records],
                stats=stats,
                **_inspect(model, reference_model, tp, layout),
            )
    return results


def _layouts(dirs, plan_name):
    return [(layout, dirs[(plan_name, layout)]) for layout in LAYOUTS]


def _control_count(mesh) -> int:
    """The counter sees a weight collective when there is one (distribute_tensor scatters from rank 0)."""
    with CollectiveCounter() as counter:
        distribute_tensor(torch.ones(8, 4), mesh["tp"], [Shard(0)])
    return len(counter.records)


def _inspect(model, reference_model, tp, layout) -> dict:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    sharded = {n: p for n, p in model.named_parameters() if isinstance(p, DTensor)}
    found = dict(
        on_meta=[n for n, t in tensors if t.device.type == "meta"],
        num_sharded=sum(1 for p in sharded.values() if p.placements[0].is_shard()),
    )
    if tp == 4 and layout == "single":  # reassembly of packed layouts: gathers, so once per plan
        ref = dict(reference_model.named_parameters())
        found["reassembly_mismatch"] = [n for n, p in sharded.items() if not torch.equal(full_tensor(p), ref[n])]
    return found


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    dirs = _save_checkpoints(tmp_path_factory.mktemp("load_parity"))
    return spawn(_worker, 4, dirs)


PARAMS = [pytest.param(c, id="-".join(map(str, c)), marks=() if c in DEFAULT else pytest.mark.full) for c in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_parity_with_diffusers(results, case):
    """Every plan, tp 2 and 4, single- and multi-file: max |sharded - diffusers| <= 1e-5 * max |ref| on every rank."""
    for rank_results in results:
        r = rank_results[case]
        assert r["num_sharded"] > 0
        assert r["diff"] <= TOLERANCE * r["ref"], (case, r["diff"], r["ref"])


@pytest.mark.parametrize("case", PARAMS)
def test_each_rank_reads_its_share(results, case):
    """bytes read <= (sharded bytes) / tp + replicated bytes + 5 %, and more than the replicated bytes alone."""
    for rank_results in results:
        stats = rank_results[case]["stats"]
        assert stats.tp == case[2]
        assert stats.sharded_bytes > 0
        assert (
            stats.replicated_bytes
            < stats.bytes_read
            <= 1.05 * (stats.sharded_bytes / stats.tp + stats.replicated_bytes)
        )


def test_no_weight_collective_and_nothing_on_meta(results):
    """Loading issues no weight collective (the counter does see distribute_tensor's), only the ranks' one
    32-byte digest exchange (engine.prepare, runtime/agree.py), and leaves nothing on meta."""
    for rank_results in results:
        assert rank_results["control"] > 0
        for case in RUN:
            assert rank_results[case]["collectives"] == ["allgather"], case
            assert rank_results[case]["on_meta"] == [], case


def test_packed_layouts_reassemble(results):
    """styles.full_tensor of every loaded DTensor equals diffusers' full parameter (packed blocks in order)."""
    for rank_results in results:
        for plan in PLAN_CLASSES:
            assert rank_results[(plan, "single", 4)]["reassembly_mismatch"] == [], plan
