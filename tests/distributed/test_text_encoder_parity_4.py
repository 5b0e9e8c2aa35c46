"""Text encoders sharded at tp=4 on 4 gloo processes, against one process.

The tiny GQA classes (Llama, Qwen, Gemma2, GLM, Mistral) have 4 query heads over 2 kv heads: at tp=4
each kv head is shared by 2 ranks (resolve/kv_share.py). The grouped Qwen2.5-VL (6 query heads in 2
groups of 3) also pads each group to 4 heads (pad=True), as Qwen-Image's encoder needs at tp=8.
"""

import pytest
from text_cases import CASES, GROUPED, RELEASED_HEADS, case_id, run_text_cases

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref| for every hidden state, fp32
# Gemma 3's and Qwen3-VL's released head shapes (4 query heads over 2 kv heads per rank) repeat the GQA kind the
# default cases cover: DTP_FULL=1 only (measured 5.5e-7 and 6.2e-7).
CASES_4 = CASES + [(GROUPED, None)] + ([(name, None) for name in RELEASED_HEADS] if full_run() else [])


@pytest.fixture(scope="module")
def results():
    return spawn(run_text_cases, 4, 4, CASES_4)


@pytest.mark.parametrize("case", [case_id(*case) for case in CASES_4])
def test_hidden_states_match(results, case):
    """Tiny configs (1 query head per rank, kv heads shared, right-padded prompt), tp=4: within 1e-5 relative."""
    for rank in results:
        assert rank[case][0] <= TOL, (case, rank[case])
