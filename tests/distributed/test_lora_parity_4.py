"""LoRA adapters on tiny FLUX.1, FLUX.2 and Qwen-Image sharded at tp=4 (4 gloo processes) vs one process."""

import pytest
from lora_cases import MODELS, run_cases

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32


@pytest.fixture(scope="module")
def results():
    return spawn(run_cases, 4, 4, False)


@pytest.mark.parametrize("model", list(MODELS))
def test_adapter_steps_match_unsharded(results, model):
    """Two rank-4 adapters on every Linear, tp=4: every step's output within 1e-5 * max |ref|, every rank."""
    for rank_results in results:
        for step, rel in rank_results[model].items():
            assert rel <= TOL, (model, step, rel)


def test_negative_control_one_block_cut_is_visible(results):
    """Cutting FLUX.1's packed_rowwise proj_out adapter as one block runs but is wrong at tp=4 too."""
    assert all(r["flux/one_block_packed_rowwise"] > 1e-2 for r in results)
