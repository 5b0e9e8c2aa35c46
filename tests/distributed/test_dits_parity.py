"""Issue 45: the remaining DiT classes of diffusers 0.42.1 that got a plan this round, and Sana-Video with its Mix-FFN
split by channels (styles/conv.py), tiny config, batch 2 (a padded prompt), tp=2 on 2 gloo processes against one
process. Their tp=4 parity and collectives are test_coverage_parity_4.py's / test_coverage_parity.py's (with
DTP_FULL=1), `dtp suggest` test_coverage_2026_suggest.py's."""

import pytest
from dits_cases import run_dits

from dtp.testing.launch import spawn

TOL = 1e-5  # max |sharded - ref| <= TOL * max |ref|, fp32


@pytest.fixture(scope="module")
def results():
    return spawn(run_dits, 2)


def test_omnigen_is_exact(results):
    """OmniGen at tp=2: the heads' output reshaped to the rewritten attn.out_dim, the vocabulary split with the pad
    id in the last rank's rows (measured 2.4e-7)."""
    assert all(r["omnigen"] <= TOL for r in results), [r["omnigen"] for r in results]


def test_negative_control_omnigen_out_dim_left_global_is_refused(results):
    """Without out_dim rewritten per rank the processor's reshape to the global width cannot run: prepare's flow check
    refuses the plan naming the attention module, before anything is sharded."""
    outcomes = [r["omnigen/out_dim_global"] for r in results]
    assert all(o.startswith("PlanError") and "self_attn" in o for o in outcomes), outcomes


def test_sana_video_mix_ffn_split_by_channels_is_exact(results):
    """Sana-Video at tp=2 with the Mix-FFN's convolutions split by channels (conv_inverted packed [value | gate],
    depthwise conv_depth on the same channels, conv_point rowwise, conv_temp gathered): measured 7.4e-7."""
    assert all(r["sana_video"] <= TOL for r in results), [r["sana_video"] for r in results]


def test_negative_control_mix_ffn_split_as_one_block_is_refused(results):
    """The [value | gate] channels split as one block instead of two (rank 0 would hold values only): prepare's pair
    rule refuses it, naming conv_point, before anything is sharded."""
    outcomes = [r["sana_video/unpacked"] for r in results]
    assert all(o.startswith("PlanError") and "conv_point" in o for o in outcomes), outcomes


def test_negative_control_channels_gathered_out_of_order_miss_parity(results):
    """conv_temp's gathered channels concatenated in reverse rank order: it runs and misses the bound by far."""
    assert all(r["sana_video/reversed_gather"] > 100 * TOL for r in results), [
        r["sana_video/reversed_gather"] for r in results
    ]
