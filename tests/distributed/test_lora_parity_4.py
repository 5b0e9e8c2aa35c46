"""LoRA adapters on tiny FLUX.1, FLUX.2 and Qwen-Image sharded at tp=4 (4 gloo processes) vs one process.

tp=2 (test_lora_parity_2.py) runs every model; tp=4 runs FLUX.1 by default (its packed [attn | mlp] proj_out, which
the negative control cuts wrong), FLUX.2 and Qwen-Image with DTP_FULL=1."""

import pytest
from lora_cases import MODELS, run_cases

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32
FOUR = tuple(MODELS) if full_run() else ("flux",)


@pytest.fixture(scope="module")
def results():
    return spawn(run_cases, 4, 4, False, FOUR)


@pytest.mark.parametrize("model", [m if m == "flux" else pytest.param(m, marks=pytest.mark.full) for m in MODELS])
def test_adapter_steps_match_unsharded(results, model):
    """Two rank-4 adapters on every Linear, tp=4: every step's output within 1e-5 * max |ref|, every rank."""
    for rank_results in results:
        for step, rel in rank_results[model].items():
            assert rel <= TOL, (model, step, rel)


def test_negative_control_one_block_cut_is_visible(results):
    """Cutting FLUX.1's packed_rowwise proj_out adapter as one block runs but is wrong at tp=4 too."""
    assert all(r["flux/one_block_packed_rowwise"] > 1e-2 for r in results)
