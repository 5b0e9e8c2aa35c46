"""Context parallelism parity on gloo: sharded (cp, tp) forwards against a single-process reference.

Two process groups in all: one 4-process group for Flux and Qwen-Image at (cp, tp) in
{(2, 2), (4, 1), (1, 4)} x {ulysses, ring} plus a text length cp=4 does not divide (padded), and one
2-process group for Flux2 and Z-Image at (cp=2, tp=1). Tolerance: max |out - ref| <= 1e-5 * max |ref|
(measured 0..6.2e-7). Negative controls on Z-Image (batch 2, masked): each rank's own key mask standing for
every rank's (the mask all-gather skipped), in both modes, and ring attention dropping every block it receives
(each rank attends to its own keys only), each miss it by far (3.1e-2..3.6e-1).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dtp
import dtp.runtime.cp.attention as attention_module
import dtp.runtime.cp.ring as ring_module
import dtp.runtime.cp.ulysses as ulysses_module
from dtp.runtime.cp import remove_cp
from dtp.testing.counting import CallCounter
from dtp.testing.launch import spawn
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

TOL = 1e-5
MODES = ("ulysses", "ring")
FOUR_PROC_MESHES = ((2, 2), (4, 1), (1, 4))  # (cp, tp)
FLUX, FLUX2, QWEN, ZIMAGE = (
    "FluxTransformer2DModel",
    "Flux2Transformer2DModel",
    "QwenImageTransformer2DModel",
    "ZImageTransformer2DModel",
)


def _inputs(cls: str) -> dict:
    """Tiny inputs; Qwen-Image and Z-Image with batch 2 and a real key mask, to exercise mask gathering."""
    if cls == QWEN:
        inputs = tiny_inputs(cls, batch=2)
        inputs["encoder_hidden_states_mask"][1, -3:] = 0  # sample 1: last 3 text tokens are padding
        return inputs
    if cls == ZIMAGE:
        inputs = tiny_inputs(cls, batch=2)
        g = torch.Generator().manual_seed(7)
        # sample 1: a 12 x 12 latent -> 36 patches, padded to 64 (sample 0: 16 -> 32), so a [B, S] mask
        inputs["x"][1] = torch.randn(inputs["x"][1].shape[0], 1, 12, 12, generator=g)
        return inputs
    return tiny_inputs(cls)


@torch.no_grad()
def _parity(cls: str, mesh, mode: str, ref: torch.Tensor, inputs: dict) -> dict:
    model = dtp.parallelize(tiny_model(cls), mesh, cp_mode=mode)
    with CallCounter(ulysses_module, "to_heads") as a2a, CallCounter(ring_module, "block_attention") as blocks:
        out = output_tensor(model(**inputs)).float()
    return dict(
        diff=float((out - ref).abs().max()),
        ref=float(ref.abs().max()),
        ulysses_calls=a2a.calls,
        ring_blocks=blocks.calls,
        shape_ok=out.shape == ref.shape,
    )


def _four_proc(rank: int, world: int) -> dict:
    results = {}
    for cls in (FLUX, QWEN):
        inputs = _inputs(cls)
        with torch.no_grad():
            ref = output_tensor(tiny_model(cls)(**inputs)).float()
        for cp, tp in FOUR_PROC_MESHES:
            mesh = dtp.make_mesh(tp=tp, cp=cp)
            for mode in MODES:
                results[(cls, cp, tp, mode)] = _parity(cls, mesh, mode, ref, inputs)
    inputs = tiny_inputs(FLUX, txt_tokens=6)  # 6 text tokens at cp=4: padded to 8, the pad keys masked
    with torch.no_grad():
        ref = output_tensor(tiny_model(FLUX)(**inputs)).float()
    results["indivisible", "ring"] = _parity(FLUX, dtp.make_mesh(tp=1, cp=4), "ring", ref, inputs)
    return results


def _two_proc(rank: int, world: int) -> dict:
    results = {}
    mesh = dtp.make_mesh(tp=1, cp=2)
    for cls in (FLUX2, ZIMAGE):
        inputs = _inputs(cls)
        with torch.no_grad():
            ref = output_tensor(tiny_model(cls)(**inputs)).float()
        for mode in MODES:
            results[(cls, 2, 1, mode)] = _parity(cls, mesh, mode, ref, inputs)
    # remove_cp undoes everything: the model runs unsplit, with local attention, and equals the reference.
    model = dtp.parallelize(tiny_model(FLUX2), mesh, cp_mode="ring")
    remove_cp(model)
    inputs = _inputs(FLUX2)
    with torch.no_grad(), CallCounter(ring_module, "block_attention") as blocks:
        out = output_tensor(model(**inputs))
        ref = output_tensor(tiny_model(FLUX2)(**inputs))
    results["removed"] = dict(ring_blocks=blocks.calls, equal=bool(torch.equal(out, ref)))
    results["controls"] = _controls(mesh)
    return results


def _local_mask(mask, group):
    """The bug: this rank's [B, S_local] key mask repeated for every rank's keys instead of all-gathered."""
    return None if mask is None else mask.repeat(1, dist.get_world_size(group))


def _local_keys(out_a, lse_a, out_b, lse_b, **unused):
    """The bug: the block received from another rank dropped instead of merged."""
    return out_a, lse_a


CONTROLS = {  # name: (cp mode, module, attribute, replacement)
    "local_mask_ulysses": ("ulysses", attention_module, "gather_key_mask", _local_mask),
    "local_mask_ring": ("ring", attention_module, "gather_key_mask", _local_mask),
    "ring_local_keys": ("ring", ring_module, "merge", _local_keys),
}


@torch.no_grad()
def _controls(mesh) -> dict:
    """{control: max |out - ref| / max |ref|} of Z-Image (batch 2, masked) with each bug in place."""
    inputs = _inputs(ZIMAGE)
    ref = output_tensor(tiny_model(ZIMAGE)(**inputs)).float()
    found = {}
    for name, (mode, module, attribute, bug) in CONTROLS.items():
        real = getattr(module, attribute)
        setattr(module, attribute, bug)
        try:
            out = output_tensor(dtp.parallelize(tiny_model(ZIMAGE), mesh, cp_mode=mode)(**inputs)).float()
        finally:
            setattr(module, attribute, real)
        found[name] = float((out - ref).abs().max() / ref.abs().max())
    return found


@pytest.fixture(scope="module")
def four():
    return spawn(_four_proc, 4)


@pytest.fixture(scope="module")
def two():
    return spawn(_two_proc, 2)


def _check(per_rank: list[dict], key, expect_cp: int) -> None:
    for rank, results in enumerate(per_rank):
        r = results[key]
        assert r["shape_ok"], (rank, key)
        print(f"{key}: {r['diff'] / r['ref']:.2e} vs one process")
        assert r["diff"] <= TOL * r["ref"], (rank, key, r)
        mode = key[-1]
        if expect_cp == 1:
            assert r["ulysses_calls"] == 0 and r["ring_blocks"] == 0, (rank, key, r)
        elif mode == "ulysses":
            assert r["ulysses_calls"] > 0 and r["ring_blocks"] == 0, (rank, key, r)
        else:  # every attention call visits cp key blocks
            assert r["ring_blocks"] > 0 and r["ring_blocks"] % expect_cp == 0 and r["ulysses_calls"] == 0, (
                rank,
                key,
                r,
            )


@pytest.mark.parametrize("cls", [FLUX, QWEN])
@pytest.mark.parametrize("cp,tp", FOUR_PROC_MESHES)
@pytest.mark.parametrize("mode", MODES)
def test_four_process_parity(four, cls, cp, tp, mode):
    """Flux / Qwen-Image tiny at (cp, tp) on 4 gloo ranks: max |out - ref| <= 1e-5 * max |ref|."""
    _check(four, (cls, cp, tp, mode), cp)


@pytest.mark.parametrize("cls", [FLUX2, ZIMAGE])
@pytest.mark.parametrize("mode", MODES)
def test_two_process_parity(two, cls, mode):
    """Flux2 / Z-Image (batch 2, masked) tiny at cp=2, tp=1: max |out - ref| <= 1e-5 * max |ref|."""
    _check(two, (cls, 2, 1, mode), 2)


def test_indivisible_sequence_is_padded(four):
    """6 text tokens at cp=4 (ring): padded to a multiple of 4, the pad keys masked: exact, on every rank."""
    _check(four, ("indivisible", "ring"), 4)


def test_remove_cp_restores_the_plain_model(two):
    """After remove_cp no CP attention runs and the output is bit-identical to an untouched model."""
    for results in two:
        assert results["removed"] == dict(ring_blocks=0, equal=True)


@pytest.mark.parametrize("control", list(CONTROLS))
def test_plausible_bugs_fail(two, control):
    """Negative controls: a key mask not gathered (per-rank), or ring over local keys only, misses 1e-5 by 100x."""
    for results in two:
        found = results["controls"][control]
        print(f"{control}: {found:.2e} vs one process")
        assert found > 100 * TOL, (control, found)
