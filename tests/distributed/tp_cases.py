"""Worker side of the TP parity tests: one spawned group runs many cases and returns their numbers."""

import dataclasses
from functools import partial
from unittest import mock

import torch
import torch.nn.functional as F

import dtp
from dtp.engine import apply, prepare
from dtp.styles import full_tensor
from dtp.styles.collectives import all_reduce
from dtp.styles.parallel import Rowwise
from dtp.testing.parity import forward_parity
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model

# The plans bundled before issue 10 (the ones CASES name in test_tp_parity_2/_4.py). The plans added
# for coverage run in test_coverage_parity*.py, one spawn per degree, so no plan pays twice in CI.
PLANS = ("flux", "flux2", "qwenimage", "zimage")


def run_cases(rank, world_size, tp, cp, diffusers_plans: bool = True):
    """Every bundled plan (YAML and, where diffusers has one and `diffusers_plans`, its `_tp_plan` dict) on a (cp, tp)
    mesh.

    With cp > 1 the YAML plans run TP on `tp` and their cp sections (Ulysses) on `cp`.
    """
    mesh = dtp.make_mesh(tp=tp, cp=cp)
    results = {}
    for plan_name in PLANS:
        cls = PLAN_CLASSES[plan_name]
        inputs = tiny_inputs(cls)
        make = partial(tiny_model, cls)
        results[f"{plan_name}/yaml"] = forward_parity(make, inputs, mesh, dtp.load_plan(plan_name)).relative
        diffusers_plan = getattr(dtp.testing.tiny.model_class(cls), "_tp_plan", None)
        if diffusers_plan and diffusers_plans:
            # A bare `_tp_plan` has no cp section, so on a (cp > 1) mesh it runs on the `tp` axis alone.
            tp_mesh = mesh["tp"] if cp > 1 else mesh
            plan = dtp.Plan.from_dict(diffusers_plan)
            results[f"{plan_name}/diffusers"] = forward_parity(make, inputs, tp_mesh, plan).relative
    results["flux2/packed_reassembly"] = packed_reassembly_exact(mesh)
    results["flux2/plain_colwise_swiglu"] = wrong_swiglu_split(mesh)
    results["local_heads"] = local_heads(mesh)
    results["flux/bias_before_reduce"] = bias_before_reduce(mesh)
    return results


def bias_before_reduce(mesh) -> float:
    """Negative control: every rank adds the rowwise bias before the all-reduce (so it counts tp times)."""

    def every_rank(self, x, weight, bias):
        return all_reduce(F.linear(x, weight, bias), self.tp.group)

    cls = PLAN_CLASSES["flux"]
    with mock.patch.object(Rowwise, "compute", every_rank):
        return forward_parity(partial(tiny_model, cls), tiny_inputs(cls), mesh, dtp.load_plan("flux")).relative


def packed_reassembly_exact(mesh) -> bool:
    """Gathering a packed parameter over the ranks and unpacking gives the original tensor bit for bit."""
    cls = "Flux2Transformer2DModel"
    original = tiny_model(cls).single_transformer_blocks[0].attn
    sharded = dtp.parallelize(tiny_model(cls), mesh, dtp.load_plan("flux2")).single_transformer_blocks[0].attn
    return all(
        torch.equal(full_tensor(getattr(sharded, name).weight), getattr(original, name).weight)
        for name in ("to_qkv_mlp_proj", "to_out")
    )


@torch.no_grad()
def wrong_swiglu_split(mesh) -> float:
    """Negative control: Flux2's fused SwiGLU split as one block (the checks bypassed) runs but is wrong."""
    cls = "Flux2Transformer2DModel"
    model = tiny_model(cls)
    prepared = prepare(model, mesh, dtp.load_plan("flux2"))
    linears = tuple(
        dataclasses.replace(spec, sizes=(sum(spec.sizes),)) if spec.path.endswith("ff.linear_in") else spec
        for spec in prepared.resolved.linears
    )
    apply(model, dataclasses.replace(prepared, resolved=dataclasses.replace(prepared.resolved, linears=linears)))
    ref = output_tensor(tiny_model(cls)(**tiny_inputs(cls)))
    out = output_tensor(model(**tiny_inputs(cls)))
    return float((out - ref).abs().max() / ref.abs().max())


def local_heads(mesh) -> dict:
    model = dtp.parallelize(tiny_model("QwenImageTransformer2DModel"), mesh, dtp.load_plan("qwenimage"))
    attn = model.transformer_blocks[0].attn
    return {"heads": attn.heads, "inner_dim": attn.inner_dim, "inner_kv_dim": attn.inner_kv_dim}
