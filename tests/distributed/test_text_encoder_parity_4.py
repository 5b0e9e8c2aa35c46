"""Text encoders without GQA sharded at tp=4 on 4 gloo processes, against one process.

The tiny GQA classes (Llama, Qwen, Gemma2, GLM, Mistral) have 2 kv heads, which tp=4 does not
divide: dtp refuses them (tests/unit/test_text_plans.py), as it does not replicate kv heads.
"""

import pytest
from text_cases import CASES, case_id, run_text_cases

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref| for every hidden state, fp32
MHA = [case for case in CASES if case[0].startswith(("T5", "UMT5", "CLIP"))]


@pytest.fixture(scope="module")
def results():
    return spawn(run_text_cases, 4, 4, MHA)


@pytest.mark.parametrize("case", [case_id(*case) for case in MHA])
def test_hidden_states_match(results, case):
    """Tiny config (4 heads: 1 per rank, right-padded prompt), tp=4: every hidden state within 1e-5 relative."""
    for rank in results:
        assert rank[case][0] <= TOL, (case, rank[case])
