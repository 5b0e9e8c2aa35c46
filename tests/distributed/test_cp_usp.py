"""USP (Ulysses x ring): `dtp.make_mesh(cp=4, ulysses=2)` on 4 gloo ranks: Ulysses all-to-all inside each pair of
consecutive ranks, ring attention over the pairs. FLUX.1 tiny (4 heads, batch 2) against one process within 1e-5 of
max |ref|: 16 image + 8 text tokens, and 15 + 7 (padded: the pad keys' mask travels through both levels); both
`cp_mode`s run USP on such a mesh (measured 4.0e-7, 4.1e-7). Negative controls (padded case): the ring merging a
Ulysses group's key masks in the wrong order (each group's two blocks swapped: rank 3's pad keys land on rank 2's;
3.8e-2), and a group's heads taken from the wrong rank on the way back (the head groups rolled by one; 0.45).
In the same group: Wan with 9 video tokens (padded; 2.2e-7) and Qwen-Image 2.1 refused (block-causal: Ulysses only);
the other models, fsdp and compile under USP: `test_cp_usp_models.py` (DTP_FULL=1).
"""

from __future__ import annotations

import pytest
import torch
from usp_cases import (
    CONTROLS,
    WAN,
    block_causal_refusal,
    check_block_causal_refused,
    check_controls_failed,
    run_case,
)

import dtp
import dtp.runtime.cp.ring as ring_module
import dtp.runtime.cp.ulysses as ulysses_module
from dtp.testing.counting import CallCounter
from dtp.testing.launch import spawn
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

TOL = 1e-5
FLUX = "FluxTransformer2DModel"
SHAPES = ((16, 8), (15, 7))  # (image tokens, text tokens)


@torch.no_grad()
def _run(rank: int, world: int) -> dict:
    results = {}
    mesh = dtp.make_mesh(cp=4, ulysses=2)
    for img, txt in SHAPES:
        inputs = tiny_inputs(FLUX, batch=2, img_tokens=img, txt_tokens=txt)
        ref = output_tensor(tiny_model(FLUX)(**inputs)).float()
        for mode in ("ulysses", "ring"):
            model = dtp.parallelize(tiny_model(FLUX), mesh, cp_mode=mode)
            with CallCounter(ring_module, "block_attention") as blocks, CallCounter(ulysses_module, "to_heads") as a2a:
                out = output_tensor(model(**inputs)).float()
            error = float((out - ref).abs().max() / ref.abs().max())
            results[img, txt, mode] = dict(error=error, ring_blocks=blocks.calls, ulysses=a2a.calls)
    for name, (module, attribute, bug) in CONTROLS.items():
        real = getattr(module, attribute)
        setattr(module, attribute, bug)
        try:
            out = output_tensor(dtp.parallelize(tiny_model(FLUX), mesh, cp_mode="ring")(**inputs)).float()
        finally:
            setattr(module, attribute, real)
        results[name] = float((out - ref).abs().max() / ref.abs().max())
    try:
        dtp.make_mesh(cp=4, ulysses=3)
        results["indivisible"] = None
    except dtp.PlanError as error:
        results["indivisible"] = str(error)
    results["wan_odd"] = run_case(mesh, "wan_odd", WAN, {})  # the other models: test_cp_usp_models.py (full)
    results["qwen21"] = block_causal_refusal(mesh)
    return results


@pytest.fixture(scope="module")
def runs():
    return spawn(_run, 4)


@pytest.mark.parametrize("img,txt", SHAPES)
@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_usp_parity(runs, img, txt, mode):
    """ring 2 x ulysses 2: exact; every attention ran both the all-to-all and ring blocks (2 per call)."""
    for rank, results in enumerate(runs):
        r = results[img, txt, mode]
        print(f"FLUX.1 {img}+{txt} tokens, cp_mode={mode}: {r['error']:.2e} vs one process")
        assert r["error"] <= TOL, (rank, r)
        assert r["ulysses"] > 0 and r["ring_blocks"] == 2 * r["ulysses"], (rank, r)


@pytest.mark.parametrize("control", list(CONTROLS))
def test_usp_controls_fail(runs, control):
    check_controls_failed(runs, control)


def test_usp_padded_wan(runs):
    """Wan with 9 video tokens (padded to 12; rank 3 holds pad only) under ring 2 x ulysses 2: exact."""
    for results in runs:
        found = results["wan_odd"]
        print(f"Wan 9 tokens: {found['error']:.2e} vs one process, {found['blocks']} ring blocks")
        assert found["error"] <= TOL and found["blocks"] > 0, found


def test_block_causal_model_refuses_usp(runs):
    """Qwen-Image 2.1 takes Ulysses only (`ring_refused`): a ring degree of 2 is a PlanError, the model untouched."""
    check_block_causal_refused(runs)


def test_ulysses_must_divide_cp(runs):
    for results in runs:
        assert results["indivisible"] is not None and "ulysses=3 does not divide cp=4" in results["indivisible"]
