"""Qwen-Image's text encoder shape at tp=8 on 8 gloo processes: Qwen2.5-VL with 28 query heads over 4 kv heads.

The full-size case the pipeline benchmark measures (Qwen2.5-VL-7B at tp=8), in small: each group of 7
query heads pads to 8 (4 per rank: 3 real + 1 zero, or 4 real), each kv head is shared by 2 ranks,
the SwiGLU width 150 pads to 152, the vocabulary of 64 rows splits by 8. Every hidden state and the
logits against one process, with the right-padded prompt.
"""

import pytest
from text_cases import QWEN_7B_HEADS, run_text_cases

from dtp.testing.launch import spawn

TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    return spawn(run_text_cases, 8, 8, [(QWEN_7B_HEADS, None)])


def test_qwen_7b_heads_at_tp8(results):
    """tp=8, pad=True: max |sharded - ref| / max |ref| <= 1e-5 over every hidden state and the logits."""
    for rank in results:
        assert rank[QWEN_7B_HEADS][0] <= TOL, rank[QWEN_7B_HEADS]
