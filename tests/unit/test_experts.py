"""The `experts` style without processes: every expert split like an MLP pair (each rank a slice of every expert),
its layouts against diffusers' own SwiGLUExperts, the target check, pad=True, and NucleusMoE's plan resolved."""

import dataclasses

import pytest
import torch
from diffusers.models.transformers.transformer_nucleusmoe_image import SwiGLUExperts
from hypothesis import given, settings
from hypothesis import strategies as st

import dtp
from dtp.plan import Style
from dtp.resolve import resolve
from dtp.resolve.binding.linears import ExpertsSpec
from dtp.resolve.transforms.padding import pad_resolved
from dtp.testing.tiny import tiny_model

NUCLEUS = "NucleusMoEImageTransformer2DModel"


def _experts(experts: int, width: int, hidden: int, seed: int) -> SwiGLUExperts:
    torch.manual_seed(seed)
    module = SwiGLUExperts(hidden_size=width, moe_intermediate_dim=hidden, num_experts=experts)
    with torch.no_grad():
        for param in module.parameters():
            param.normal_(0, 0.3)
    return module


def _spec(hidden: int) -> ExpertsSpec:
    rule = dtp.Plan.from_dict({"b.*.experts": "experts"}).rules[0]
    return ExpertsSpec("b.0.experts", rule, (hidden, hidden), has_bias=False)


@settings(max_examples=20, deadline=None)
@given(
    experts=st.integers(1, 4),
    width=st.sampled_from([4, 8]),
    units=st.integers(1, 3),
    tp=st.sampled_from([1, 2, 4]),
    counts=st.lists(st.integers(0, 5), min_size=4, max_size=4),
)
def test_rank_slices_of_every_expert_sum_to_diffusers_output(experts, width, units, tp, counts):
    """sum_r of the experts built from each rank's slices (the spec's layouts) == diffusers' forward on the whole
    weights, for any routing (tokens per expert, empty experts and padding rows included); and rank r's
    gate_up slice is gate.chunk(tp)[r] next to up.chunk(tp)[r] (an independent construction)."""
    hidden = units * tp
    full = _experts(experts, width, hidden, seed=experts * 100 + hidden)
    per_expert = torch.tensor(counts[:experts])
    x = torch.randn(int(per_expert.sum()) + 2, width)  # 2 padding rows after the routed tokens
    layouts = _spec(hidden).param_layouts()
    total = torch.zeros_like(x)
    for rank in range(tp):
        local = _experts(experts, width, units, seed=0)
        gate, up = full.gate_up_proj.data.chunk(2, dim=-1)
        expected = torch.cat([gate.chunk(tp, dim=-1)[rank], up.chunk(tp, dim=-1)[rank]], dim=-1)
        sliced = layouts["gate_up_proj"].local_slice(full.gate_up_proj.data, tp, rank)
        assert torch.equal(sliced, expected)
        with torch.no_grad():
            local.gate_up_proj.copy_(sliced)
            local.down_proj.copy_(layouts["down_proj"].local_slice(full.down_proj.data, tp, rank))
            total += local(x, per_expert)
    with torch.no_grad():
        reference = full(x, per_expert)
    assert torch.allclose(total, reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()) + 1e-6)


def test_nucleus_plan_shards_only_the_moe_blocks_experts():
    """Tiny NucleusMoE: block 0 dense (its MLP pair planned), block 1 experts + shared expert; the router stays."""
    resolved = resolve(dtp.load_plan("nucleusmoe"), tiny_model(NUCLEUS))
    styles = {spec.path: spec.style for spec in resolved.linears}
    assert styles["transformer_blocks.1.img_mlp.experts"] is Style.EXPERTS
    assert "transformer_blocks.0.img_mlp.net.2" in styles and "transformer_blocks.0.img_mlp.experts" not in styles
    assert not any(path.endswith("img_mlp.gate") for path in styles)
    layouts = resolved.param_layouts()
    assert layouts["transformer_blocks.1.img_mlp.experts.gate_up_proj"] == dtp.Layout(2, (32, 32))
    assert layouts["transformer_blocks.1.img_mlp.experts.down_proj"] == dtp.Layout(1, (32,))


def test_experts_on_a_linear_is_a_plan_error_naming_the_path():
    model = tiny_model(NUCLEUS)
    plan = dtp.Plan.from_dict({"transformer_blocks.1.img_mlp.gate": "experts"})
    with pytest.raises(dtp.PlanError, match=r"'transformer_blocks.1.img_mlp.gate' is a Linear, not a module of SwiGLU"):
        resolve(plan, model)


def test_pad_refuses_expert_widths_tp_does_not_divide():
    """pad=True leaves expert hidden units unpadded; a tp that does not divide them is a PlanError naming them."""
    model = tiny_model(NUCLEUS, moe_intermediate_dim=36)  # 36 units: tp=8 does not divide them
    resolved = resolve(dtp.load_plan("nucleusmoe"), model)
    experts = dataclasses.replace(resolved, linears=tuple(s for s in resolved.linears if s.style is Style.EXPERTS))
    with pytest.raises(dtp.PlanError, match="tp=8 does not divide the 36 hidden units of every expert"):
        pad_resolved(experts, model, 8)
    assert pad_resolved(experts, model, 4).resolved.linears[0].param_layouts()["down_proj"] == dtp.Layout(1, (36,))
