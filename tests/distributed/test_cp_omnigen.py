"""CP for OmniGen (issue 45): Ulysses with the pipeline's full [B, 1, S, S] mask applied whole; gloo parity with one
process.

ONE 4-process group. OmniGen tiny (4 heads of 16, 2 layers, perturbed weights), batch 2 (sample 1's prompt left-padded,
its pad keys masked), 9 condition tokens + 1 time token + 16 image tokens = 26 joint tokens, 13 a rank, at (cp=2,
tp=2) Ulysses by default, and at cp=2 (ranks {0, 1} and {2, 3} each a (cp=2, tp=1) submesh) with DTP_FULL=1:
max |out - ref| <= 1e-5 * max |ref|. Ring is refused before anything changes (`ring_refused`). Negative control: the
whole mask's query rows shifted by one rank's share (each query given another rank's query's row, the mask cut by
query rows wrongly), and with 25 joint tokens (padded to 26) the padded mask's pad key left visible: far off.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import dtp
import dtp.runtime.cp.attention as attention_module
import dtp.runtime.cp.whole_pad as whole_pad
from dtp.analysis.launch import spawn
from dtp.testing.scope import full_run
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model

TOL = 1e-5
CLS = PLAN_CLASSES["omnigen"]


@torch.no_grad()
def _rel(model, inputs: dict, ref: torch.Tensor) -> float:
    out = output_tensor(model(**inputs)).float()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    return float((out - ref).abs().max() / ref.abs().max())


def _inputs(txt: int = 9) -> dict:
    return tiny_inputs(CLS, batch=2, txt_tokens=txt)  # txt condition + 1 time + 16 image joint tokens


@torch.no_grad()
def _all(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    inputs = _inputs()
    ref = output_tensor(tiny_model(CLS)(**inputs)).float()
    results = {"length": int(inputs["position_ids"].shape[1])}
    tp = dtp.make_mesh(cp=2, tp=2)
    results["tp"] = _rel(dtp.parallelize(tiny_model(CLS), tp, cp_mode="ulysses"), inputs, ref)
    if full_run():  # cp=2 alone: ranks {0, 1} and {2, 3} each run the whole batch on a (cp=2, tp=1) submesh
        pairs = init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("pair", "cp", "tp"))["cp", "tp"]
        results["cp"] = _rel(dtp.parallelize(tiny_model(CLS), pairs, cp_mode="ulysses"), inputs, ref)
    # 8 + 1 + 16 = 25 joint tokens: padded to 26 with the RoPE rows, the model's 25 x 25 mask padded (pad keys
    # masked), the pad row trimmed at the norm's gather
    odd = _inputs(txt=8)
    odd_ref = output_tensor(tiny_model(CLS)(**odd)).float()
    results["padded"] = _rel(dtp.parallelize(tiny_model(CLS), tp, cp_mode="ulysses"), odd, odd_ref)
    masked_value = whole_pad.masked_value
    whole_pad.masked_value = lambda dtype: True if dtype == torch.bool else 0.0  # control: the pad key left visible
    try:
        results["pad_keys_unmasked"] = _rel(dtp.parallelize(tiny_model(CLS), tp, cp_mode="ulysses"), odd, odd_ref)
    finally:
        whole_pad.masked_value = masked_value
    try:
        dtp.parallelize(tiny_model(CLS), tp, cp_mode="ring")
        results["ring"] = "ran"
    except dtp.PlanError as error:
        results["ring"] = str(error)
    whole_mask = attention_module.whole_mask

    def shifted(attn_mask, query, key, group):  # control: each query row from another rank's share
        mask = whole_mask(attn_mask, query, key, group)
        return None if mask is None else mask.roll(query.shape[1], dims=-2)

    attention_module.whole_mask = shifted
    try:
        results["shifted_rows"] = _rel(dtp.parallelize(tiny_model(CLS), tp, cp_mode="ulysses"), inputs, ref)
        if full_run():
            results["cp_shifted_rows"] = _rel(dtp.parallelize(tiny_model(CLS), pairs, cp_mode="ulysses"), inputs, ref)
    finally:
        attention_module.whole_mask = whole_mask
    return results


@pytest.fixture(scope="module")
def four():
    results = spawn(_all, 4)
    print({k: v for k, v in results[0].items() if k != "ring"})  # the figures docs/cp.md quotes (-s)
    return results


def test_omnigen_ulysses_cp_tp(four):
    """(cp=2, tp=2) Ulysses: within 1e-5 relative of one process."""
    for results in four:
        assert results["tp"] <= TOL, results


@pytest.mark.full
def test_omnigen_ulysses_cp(four):
    """cp=2 Ulysses (tp=1): within 1e-5 relative of one process."""
    for results in four:
        assert results["cp"] <= TOL, results


def test_omnigen_padded(four):
    """25 joint tokens at (cp=2, tp=2) Ulysses: padded to 26, the model's mask padded with its pad key masked, within
    1e-5 relative; the pad key left visible: far off."""
    for results in four:
        assert results["padded"] <= TOL, results
        assert results["pad_keys_unmasked"] > 1e-3, results


def test_omnigen_ring_refused(four):
    """Ring at cp=2: the plan's ring_refused reason, before anything changes."""
    for results in four:
        assert "ring attention cannot run this model" in results["ring"] and "[B, 1, S, S]" in results["ring"], results


def test_negative_control_mask_rows_shifted(four):
    """The whole mask's query rows shifted by one rank's share: far outside the tolerance."""
    for results in four:
        assert results["shifted_rows"] > 1e-3, results
        assert not full_run() or results["cp_shifted_rows"] > 1e-3, results
