"""Tensor parallelism at tp=2 on 2 gloo processes against a single-process reference."""

import pytest
from tp_cases import run_cases

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32
CASES = [
    "flux/yaml",
    "flux/diffusers",
    "flux2/yaml",
    "flux2/diffusers",
    "qwenimage/yaml",
    "qwenimage/diffusers",
    "zimage/yaml",
]


@pytest.fixture(scope="module")
def results():
    return spawn(run_cases, 2, 2, 1)


@pytest.mark.parametrize("case", CASES)
def test_parity(results, case):
    """Tiny config, tp=2: max |sharded - ref| <= 1e-5 * max |ref| on every rank."""
    for rank_results in results:
        assert rank_results[case] <= TOL, (case, rank_results[case])


def test_packed_parameters_reassemble_exactly(results):
    assert all(r["flux2/packed_reassembly"] for r in results)


def test_negative_control_wrong_split_is_visible(results):
    """Splitting Flux2's [gate | up] as one block runs without error: parity must catch it."""
    assert all(r["flux2/plain_colwise_swiglu"] > 1e-2 for r in results)


def test_negative_control_rowwise_bias_added_once(results):
    """FLUX.1 tiny with the rowwise bias added on every rank before the all-reduce: parity must catch it."""
    assert all(r["flux/bias_before_reduce"] > 1e-2 for r in results)


def test_attention_bookkeeping_is_local(results):
    """Qwen-Image tiny (4 heads x 16): each of 2 ranks holds 2 heads, inner dims 32."""
    assert results[0]["local_heads"] == {"heads": 2, "inner_dim": 32, "inner_kv_dim": 32}
