"""Text encoders sharded by their bundled plans at tp=2 on 2 gloo processes, against one process."""

import pytest
from text_cases import CASES, case_id, run_text_cases

from dtp.testing.launch import spawn
from dtp.testing.tiny_text import TEXT_CLASSES

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref| for every hidden state (and logits), fp32
BYTES = 0.6  # a rank's share of the encoder's weight bytes at tp=2


@pytest.fixture(scope="module")
def results():
    return spawn(run_text_cases, 2, 2)


@pytest.mark.parametrize("cls", [case_id(*case) for case in CASES])
def test_hidden_states_match(results, cls):
    """Tiny config (4 heads, 2 kv heads, right-padded prompt), tp=2: every hidden state within 1e-5 relative."""
    for rank in results:
        assert rank[cls][0] <= TOL, (cls, rank[cls])


@pytest.mark.parametrize("cls", TEXT_CLASSES)
def test_rank_holds_at_most_six_tenths(results, cls):
    """Tiny config, tp=2: a rank holds <= 0.6 of the encoder's (language model's) parameter bytes."""
    for rank in results:
        assert rank[cls][1] <= BYTES, (cls, rank[cls])
