"""runtime/agree.py without a real group: the fingerprint's contents, the difference report, the fake-group skip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dtp
from dtp.analysis.collectives import CollectiveCounter
from dtp.engine import prepare
from dtp.runtime.agree import describe, differences, failed, fingerprint
from dtp.testing.tiny import tiny_model

FLUX = "FluxTransformer2DModel"


def _items(model, plan, mesh, cp_mode="ulysses"):
    p = prepare(model, mesh, plan, cp_mode=cp_mode)
    return fingerprint(model, p.resolved, p.cp_resolved, mesh, {"cp_mode": cp_mode})


# ---- the fingerprint (fake group of 4: meshes without communication) ------------------------------


def test_identical_ranks_have_identical_fingerprints(fake_world):
    """Two tiny Flux models from different seeds: weights differ, structure does not, so the items agree."""
    mesh = dtp.make_mesh(tp=4)
    plan = dtp.load_plan("flux")
    assert _items(tiny_model(FLUX, seed=0), plan, mesh) == _items(tiny_model(FLUX, seed=1), plan, mesh)


def test_the_plan_file_path_is_not_part_of_the_fingerprint(fake_world, tmp_path):
    """Two nodes may keep the same plan in different folders: equal rules give equal items."""
    copy = tmp_path / "elsewhere.yaml"
    shutil.copy(Path(__file__).resolve().parents[2] / "plans" / "flux.yaml", copy)
    mesh = dtp.make_mesh(tp=4)
    model = tiny_model(FLUX)
    assert _items(model, dtp.load_plan("flux"), mesh) == _items(model, dtp.load_plan(str(copy)), mesh)


def test_what_must_agree_is_in_the_fingerprint(fake_world):
    """Each thing the issue lists changes at least one item: dtype, blocks, plan, mesh, cp_mode, adapters."""
    mesh, plan = dtp.make_mesh(tp=4), dtp.load_plan("flux")
    base = dict(_items(tiny_model(FLUX), plan, mesh))
    variants = {
        "dtype": _items(tiny_model(FLUX).to(torch.bfloat16), plan, mesh),
        "blocks": _items(tiny_model(FLUX, num_single_layers=3), plan, mesh),
        "plan": _items(tiny_model(FLUX), dtp.Plan.from_dict(tiny_model(FLUX)._tp_plan), mesh),
        "mesh": _items(tiny_model(FLUX), plan, dtp.make_mesh(tp=2, cp=2)),
    }
    for name, items in variants.items():
        assert dict(items) != base, name
    cp_mesh = dtp.make_mesh(tp=2, cp=2)
    assert dict(_items(tiny_model(FLUX), plan, cp_mesh, "ring")) != dict(_items(tiny_model(FLUX), plan, cp_mesh))


def test_a_peft_adapter_is_part_of_the_fingerprint(fake_world):
    from peft import LoraConfig

    mesh, plan = dtp.make_mesh(tp=4), dtp.load_plan("flux")
    model = tiny_model(FLUX)
    model.add_adapter(LoraConfig(r=4, target_modules=["x_embedder"]), adapter_name="style")
    items = dict(_items(model, plan, mesh))
    assert '"r": 4' in items["adapter 'style'"]
    assert "adapter 'style'" not in dict(_items(tiny_model(FLUX), plan, mesh))


def test_the_fake_group_skips_the_exchange(fake_world):
    """`dtp check`'s fake group: prepare issues no collective (the fake one would return no peer's digest)."""
    with CollectiveCounter() as counter:
        prepare(tiny_model(FLUX), dtp.make_mesh(tp=4), dtp.load_plan("flux"))
    assert counter.records == []


# ---- the report -----------------------------------------------------------------------------------


def test_the_first_difference_is_the_first_label_in_rank_order():
    by_rank = {0: [("a", "1"), ("b", "2"), ("c", "3")], 1: [("a", "1"), ("b", "9"), ("c", "8")]}
    assert [label for label, _ in differences(by_rank)] == ["b", "c"]
    assert "first: b is 2 on ranks [0], 9 on ranks [1]." in describe(by_rank)


def test_a_label_one_rank_lacks_is_absent_there():
    by_rank = {0: [("key 'x'", "colwise_gathered")], 1: [], 2: [("key 'x'", "colwise_gathered")]}
    assert "key 'x' is colwise_gathered on ranks [0, 2], absent on ranks [1]" in describe(by_rank)


def test_ranks_whose_own_checks_failed_are_named_with_their_error():
    items = [("checks", "passed"), ("mesh", "cpu, tp=2")]
    message = describe({0: items, 1: failed(dtp.PlanError("key 'k' matches nothing")), 2: items})
    assert message.startswith("ranks [1] failed the checks that ranks [0, 2] passed")
    assert "on ranks [1]: PlanError: key 'k' matches nothing" in message
    assert "mesh" not in message  # the rest of a failed rank's fingerprint is absent: not a difference worth naming


LABELS = st.sampled_from(["a", "b", "c", "d"])
VALUES = st.sampled_from(["0", "1", "2"])
RANK_ITEMS = st.dictionaries(LABELS, VALUES).map(lambda d: list(d.items()))


@given(st.lists(RANK_ITEMS, min_size=2, max_size=4))
def test_differences_are_exactly_the_labels_whose_values_differ(ranks):
    """Each reported label splits the ranks into groups by their value ("absent" when missing), and every
    label on which two ranks differ is reported; None/empty exactly when all ranks agree."""
    by_rank = dict(enumerate(ranks))
    found = dict(differences(by_rank))
    for label in {label for items in ranks for label, _ in items}:
        values = [dict(items).get(label, "absent") for items in ranks]
        assert (label in found) == (len(set(values)) > 1)
        if label in found:
            assert {r: v for v, rs in found[label].items() for r in rs} == dict(enumerate(values))
    agree = all(dict(items) == dict(ranks[0]) for items in ranks)
    assert (describe(by_rank) is None) == agree


def test_describe_is_none_exactly_when_the_ranks_agree():
    """Both outcomes built explicitly (the property above may draw few agreeing cases)."""
    assert describe({0: [("a", "0")], 1: [("a", "0")]}) is None
    assert describe({0: [("a", "0")], 1: [("a", "1")]}) is not None


@pytest.mark.parametrize("rank_count", [2, 4])
def test_describe_counts_the_differences(rank_count):
    by_rank = {r: [(f"x{i}", str(r == 1)) for i in range(6)] for r in range(rank_count)}
    message = describe(by_rank)
    assert "(6 differences)" in message and "(and 2 more)" in message
