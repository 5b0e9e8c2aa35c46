"""Context parallelism for the video families whose plans used to refuse it (issue 45): gloo parity.

ONE 4-process group for the whole module. For each family, a tiny model (perturbed weights, batch 2) at
(cp, tp) = (2, 2) Ulysses and ring and (4, 1) ring ((4, 1) Ulysses with DTP_FULL=1), against one process:
max |out - ref| <= 1e-5 * max |ref| for EVERY output (LTX-2's video and audio samples), and every CP attention
module really routed (Ulysses: one `to_heads` per call; ring: cp key blocks per call). Each new mechanism has a
negative control that must miss by far:
- LTX-2 (a rule per stream: video and audio tokens each cut with their own RoPE coords): the cross-modal
  attentions given the text's rule (`local`: the rank's queries over the rank's keys of the other stream).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dtp
import dtp.runtime.cp.ring as ring_module
import dtp.runtime.cp.ulysses as ulysses_module
from dtp.resolve import resolve, resolve_cp
from dtp.testing.launch import spawn
from dtp.testing.perturb import perturb
from dtp.testing.scope import full_run
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

TOL = 1e-5
MESHES = ((2, 2, "ulysses"), (2, 2, "ring"), (4, 1, "ring")) + (((4, 1, "ulysses"),) if full_run() else ())
FAMILIES = ("ltx2",)


def _model(name: str, **overrides):
    return perturb(tiny_model(PLAN_CLASSES[name], **overrides), seed=7)


def _inputs(name: str) -> dict:
    return tiny_inputs(PLAN_CLASSES[name], batch=2, img_tokens=16)


def _outputs(output) -> list[torch.Tensor]:
    """Every tensor a forward returns (a tuple's elements, or the sample), as fp32."""
    items = output if isinstance(output, (tuple, list)) else (output,)
    return [o.float() for o in items if isinstance(o, torch.Tensor)]


class _Counter:
    """Counts calls of a module-level function, to prove that the CP attention path really ran."""

    def __init__(self, module, name):
        self.module, self.name, self.calls = module, name, 0
        self.original = getattr(module, name)

    def __enter__(self):
        def counted(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(self.module, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.original)


@torch.no_grad()
def _run(model, mesh, mode: str, inputs: dict, refs: list, plan) -> dict:
    model = dtp.parallelize(model, mesh, plan, cp_mode=mode)
    with _Counter(ulysses_module, "to_heads") as a2a, _Counter(ring_module, "block_attention") as blocks:
        outs = _outputs(model(**inputs))
    return dict(
        rel=max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs)),
        shape_ok=[o.shape for o in outs] == [r.shape for r in refs],
        a2a=a2a.calls,
        blocks=blocks.calls,
    )


def _family(name: str, meshes: dict) -> dict:
    plan, inputs = dtp.load_plan(name), _inputs(name)
    reference = _model(name)
    with torch.no_grad():
        refs = _outputs(reference(**inputs))
    results = {(name, "modules"): len(resolve_cp(resolve(plan, reference), reference).attention)}
    for cp, tp, mode in MESHES:
        results[name, cp, tp, mode] = _run(_model(name), meshes[cp, tp], mode, inputs, refs, plan)
    return results


def _local(name: str, globs: tuple[str, ...]):
    """`name`'s plan with the attentions at `globs` marked `local` (attending over this rank's keys only)."""
    plan = dtp.load_plan(name)
    return dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, local_attention=plan.cp.local_attention + globs))


def _controls(meshes: dict) -> dict:
    results = {}
    inputs = _inputs("ltx2")
    with torch.no_grad():
        refs = _outputs(_model("ltx2")(**inputs))
    cross_modal = ("transformer_blocks.*.audio_to_video_attn", "transformer_blocks.*.video_to_audio_attn")
    results["ltx2", "control"] = _run(_model("ltx2"), meshes[2, 2], "ring", inputs, refs, _local("ltx2", cross_modal))
    return results


def _all(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    meshes = {(cp, tp): dtp.make_mesh(tp=tp, cp=cp) for cp, tp in ((2, 2), (4, 1))}
    results = {}
    for name in FAMILIES:
        results.update(_family(name, meshes))
    results.update(_controls(meshes))
    return results


@pytest.fixture(scope="module")
def four():
    return spawn(_all, 4)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("cp,tp,mode", MESHES)
def test_parity(four, name, cp, tp, mode):
    """Tiny model, batch 2, at (cp, tp, mode) on 4 gloo ranks: every output within 1e-5 * max |ref|, and every CP
    attention module routed once per call."""
    for rank, results in enumerate(four):
        r, modules = results[name, cp, tp, mode], results[name, "modules"]
        assert r["shape_ok"] and r["rel"] <= TOL, (rank, name, cp, tp, mode, r)
        if mode == "ulysses":
            assert (r["a2a"], r["blocks"]) == (modules, 0), (rank, name, r, modules)
        else:
            assert (r["a2a"], r["blocks"]) == (0, cp * modules), (rank, name, r, modules)


def test_ltx2_cross_modal_attention_with_the_text_rule_fails(four):
    """Negative control: LTX-2's audio-to-video / video-to-audio attentions left `local` (the rank's queries over
    the rank's chunk of the other stream) at (2, 2) ring are far off."""
    for results in four:
        assert results["ltx2", "control"]["rel"] > 1e-3, results["ltx2", "control"]
