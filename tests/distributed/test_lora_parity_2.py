"""LoRA adapters on tiny FLUX.1, FLUX.2 and Qwen-Image sharded at tp=2 (2 gloo processes) vs one process."""

import pytest
from lora_cases import MODELS, run_cases

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32
BAD = ["unknown module", "B rows of a shard", "ranks differ", "DoRA magnitude", "name in use"]
ADAPTED = ["a", "a+b weighted", "fused a x0.5", "unfused", "enabled", "deleted a, b active"]


@pytest.fixture(scope="module")
def results():
    return spawn(run_cases, 2, 2)


@pytest.mark.parametrize("model", list(MODELS))
def test_adapter_steps_match_unsharded(results, model):
    """Two rank-4 adapters on every Linear, tp=2: every step's output within 1e-5 * max |ref|, every rank."""
    for rank_results in results:
        for step, rel in rank_results[model].items():
            assert rel <= TOL, (model, step, rel)


@pytest.mark.parametrize("model", list(MODELS))
def test_steps_change_the_output(results, model):
    """The comparison means something: with an adapter active the reference moves by > 1 % of max |base|."""
    ref_vs_base = results[0][f"{model}/ref_vs_base"]
    assert all(ref_vs_base[step] > 1e-2 for step in ADAPTED), ref_vs_base
    assert ref_vs_base["disabled"] < TOL, ref_vs_base  # after fuse/unfuse: W + d - d rounds


def test_negative_control_one_block_cut_is_visible(results):
    """Cutting FLUX.1's packed_rowwise proj_out adapter as one block ([attn | mlp] ignored) runs but is wrong."""
    assert all(r["flux/one_block_packed_rowwise"] > 1e-2 for r in results)


def test_each_rank_holds_its_share(results):
    """Per-rank adapter bytes are below the whole adapter and equal on both ranks (same shapes everywhere)."""
    for model in MODELS:
        local = [r["bytes"][model][0] for r in results]
        full = results[0]["bytes"][model][1]
        assert local[0] == local[1] < full, (model, local, full)


@pytest.mark.parametrize("name", ["flux", "qwenimage"])
def test_pipeline_level_load_matches_diffusers(results, name):
    """dtp.load_lora_weights(pipe, folder) vs pipe.load_lora_weights(folder): transformer output within 1e-5."""
    for rank_results in results:
        found = rank_results["pipelines"]
        assert found[name] <= TOL and found[f"{name}/lora_vs_base"] > 1e-2, found


@pytest.mark.parametrize("case", BAD)
def test_bad_lora_raises_plan_error_and_changes_nothing(results, case):
    """A bad LoRA on a sharded FLUX.1 that already holds adapter "a": PlanError, tree and values as before."""
    for rank_results in results:
        raised, message, unchanged = rank_results["bad"][case]
        assert raised and unchanged, (case, message)
