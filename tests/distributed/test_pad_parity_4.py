"""pad=True on 4 gloo processes: tp=4 for head counts 4 does not divide (30, 6), from memory and from disk."""

import pytest
from pad_cases import PADDED, run_cases, save_checkpoints

from dtp.testing.launch import spawn

TOL = 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    dirs = save_checkpoints(tmp_path_factory.mktemp("pad-checkpoints"))
    return spawn(run_cases, 4, dirs)


@pytest.mark.parametrize("name", list(PADDED))
def test_padded_parity_tp4(results, name):
    """Tiny Z-Image (30 heads) / FLUX.1 / Qwen-Image (6 heads), batch 2, tp=4, pad=True:
    max |sharded - ref| <= 1e-5 * max |ref| on every rank."""
    for r in results:
        assert r[f"{name}/tp4"] <= TOL, (name, r[f"{name}/tp4"])


@pytest.mark.parametrize("name", list(PADDED))
def test_padded_shard_on_load_tp4(results, name):
    """from_pretrained(pad=True) at tp=4 matches diffusers' unsharded load (<= 1e-5 relative, batch 2),
    and no rank reads more than its share (sharded / 4 + replicated): padded rows are made, not read."""
    for r in results:
        case = r[f"{name}/load_tp4"]
        assert case["relative"] <= TOL, (name, case)
        assert case["bytes_read"] <= case["share"], (name, case)
    # The last rank holds the zero heads: it reads less than the others.
    assert results[3][f"{name}/load_tp4"]["bytes_read"] < results[0][f"{name}/load_tp4"]["bytes_read"]


def test_padded_ulysses_cp2_tp2(results):
    """FLUX.1 with 6 heads on a (cp=2, tp=2) mesh: heads padded to 8 (multiple of tp * cp), Ulysses
    runs on 2 heads per rank: max |sharded - ref| <= 1e-5 * max |ref|."""
    for r in results:
        assert r["flux6/cp2tp2"] <= TOL, r["flux6/cp2tp2"]


def test_padded_local_heads_and_reassembly(results):
    """Z-Image 30 heads of width 8 at tp=4: 32 heads, 8 per rank (64 q rows); full_tensor drops the padding."""
    for r in results:
        assert r["zimage30/local"] == {"heads": 8, "inner_dim": 64, "q_rows": 64}
        assert r["zimage30/reassembly"]


def test_nonzero_padding_is_caught(results):
    """Negative control: padded heads that are not zero change the output far beyond the tolerance."""
    assert all(r["zimage30/nonzero_padding"] > 1e-2 for r in results), [r["zimage30/nonzero_padding"] for r in results]
