"""A style defined and registered outside dtp runs through parse -> prepare -> apply -> shard-on-load -> LoRA.

Adding a style is one file plus its `register_style` call: this module is that file. `colwise_counted` splits
like colwise (W rows, bias with them) with its own ParallelStyle, which counts the modules it shards. FLUX.1's
plan with every `colwise` rule written as `colwise_counted`, at tp=2 on gloo, against one process:
max |sharded - ref| <= 1e-5 * max |ref| after parallelize, after shard-on-load, and with a LoRA.
"""

import os
import tempfile

import torch
from lora_cases import random_lora, reference_load, sharded_load

import dtp
from dtp.styles import Style, register_style, unregister_style
from dtp.styles.parallel import Colwise
from dtp.testing.launch import spawn
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"
TOL = 1e-5
APPLIED = []  # paths the toy ParallelStyle sharded, in this process


class CountedColwise(Colwise):
    def _apply(self, module, mesh):
        APPLIED.append(module)
        return super()._apply(module, mesh)


class CountedColwiseStyle(Style):
    name = "colwise_counted"
    shard_dim = 0
    role = "colwise"

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        return CountedColwise(spec, device=device, weights_local=weights_local)


def toy_plan() -> dtp.Plan:
    """The bundled FLUX.1 plan with every colwise rule in the toy style, parsed from a dict like a YAML file."""
    plan = dtp.load_plan("flux")
    rules = {}
    for rule in plan.rules:
        value = rule.style.value if rule.blocks is None else {"style": rule.style.value, "blocks": list(rule.blocks)}
        rules[rule.key] = "colwise_counted" if value == "colwise" else value
    return dtp.Plan.from_dict({"models": list(plan.models), "attention": list(plan.attention or ()), "tp": rules})


def _relative(out, ref) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


@torch.no_grad()
def _worker(rank: int, world: int, folder: str) -> dict:
    register_style(CountedColwiseStyle)
    try:
        mesh, inputs, plan = dtp.make_mesh(tp=world), tiny_inputs(FLUX), toy_plan()
        reference = tiny_model(FLUX)
        ref = output_tensor(reference(**inputs))
        if rank == 0:
            reference.save_pretrained(folder)
        torch.distributed.barrier()
        out = {"toy_rules": sum(r.style.value == "colwise_counted" for r in plan.rules)}
        model = dtp.parallelize(tiny_model(FLUX), mesh, plan)
        out["parallelize"] = _relative(output_tensor(model(**inputs)), ref)
        out["applied"] = len(APPLIED)
        loaded = dtp.from_pretrained(type(reference), folder, mesh, plan)
        out["from_pretrained"] = _relative(output_tensor(loaded(**inputs)), ref)
        lora = random_lora(reference, seed=10)
        reference_load(reference, lora, "a")
        sharded_load(loaded, lora, "a")
        lora_ref = output_tensor(reference(**inputs))
        out["lora"] = _relative(output_tensor(loaded(**inputs)), lora_ref)
        out["lora_vs_base"] = _relative(lora_ref, ref)
        return out
    finally:
        unregister_style("colwise_counted")


def test_toy_style_runs_end_to_end():
    with tempfile.TemporaryDirectory() as folder:
        results = spawn(_worker, 2, os.path.join(folder, "flux"))
    for r in results:
        assert r["toy_rules"] > 0
        assert r["applied"] >= 2 * r["toy_rules"]  # every glob matched modules in parallelize and in the load
        assert r["parallelize"] <= TOL and r["from_pretrained"] <= TOL and r["lora"] <= TOL, r
        assert r["lora_vs_base"] > 1e-2  # the adapter changes the output: the LoRA comparison means something


def test_unknown_style_is_refused_until_registered():
    rules = {"transformer_blocks.*.attn.to_q": "colwise_counted"}
    try:
        dtp.Plan.from_dict(rules)
        raise AssertionError("an unregistered style parsed")
    except dtp.PlanError as exc:
        assert "unknown style 'colwise_counted'" in str(exc)
    register_style(CountedColwiseStyle)
    try:
        assert dtp.Plan.from_dict(rules).rules[0].style is Style("colwise_counted")
    finally:
        unregister_style("colwise_counted")
