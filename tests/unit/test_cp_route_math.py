"""The pure pieces of CP for whole-sequence choices (issue 45): expert-choice shares and NABLA mask rows, each against
diffusers' own code; the `cp.gathered` plan entry."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from diffusers.models.transformers.transformer_kandinsky6_sr import nabla_block_mask

import dtp
from dtp.plan.cp import cp_plan_from_mapping
from dtp.resolve import resolve, resolve_cp
from dtp.runtime.cp.expert_choice import entry_share, whole_choice
from dtp.runtime.cp.nabla import block_means, mask_rows
from dtp.testing.tiny import PLAN_CLASSES, tiny_model


@pytest.mark.parametrize("experts,per_expert,cp", [(4, 16, 2), (4, 16, 3), (64, 256, 8), (5, 3, 4)])
def test_entry_shares_cover_every_entry_once(experts, per_expert, cp):
    """The ranks' slices tile [0, N) in rank order, and each rank's counts are how many of its entries each expert
    has (counted here entry by entry)."""
    expert_of = torch.arange(experts).repeat_interleave(per_expert)
    covered = []
    for rank in range(cp):
        share, counts = entry_share(experts, per_expert, rank, cp)
        covered += list(range(experts * per_expert))[share]
        assert counts == torch.bincount(expert_of[share], minlength=experts).tolist()
    assert covered == list(range(experts * per_expert))


def test_whole_choice_is_the_layers_own_routing():
    """`whole_choice` on the layer's scores equals what `NucleusMoELayer.forward` routes: its output rebuilt from the
    entries (shared expert + scatter of the weighted expert outputs) matches the layer's own, batch 2."""
    model = tiny_model(PLAN_CLASSES["nucleusmoe"])
    layer = model.transformer_blocks[1].img_mlp
    g = torch.Generator().manual_seed(3)
    x, plain, temb = torch.randn(2, 16, 64, generator=g), torch.randn(2, 16, 64, generator=g), torch.randn(2, 64)
    with torch.no_grad():
        ref = layer(x, plain, timestep=temb)
        router = torch.cat([temb.unsqueeze(1).expand(-1, 16, -1), plain], dim=-1)
        scores = torch.softmax(layer.gate(router).float(), dim=-1)
        index, weight = whole_choice(scores, layer.capacity_factor, layer.route_scale)
        counts = torch.full((layer.num_experts,), index.numel() // layer.num_experts)
        routed = layer.experts(x.reshape(32, 64)[index], counts) * weight.unsqueeze(-1)
        out = layer.shared_expert(x).reshape(32, 64).index_add(0, index, routed).reshape(2, 16, 64)
    assert index.numel() == layer.num_experts * 2 * math.ceil(layer.capacity_factor * 16 / layer.num_experts)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_mask_rows_are_the_whole_masks_rows():
    """A rank's rows of NABLA's block mask, from its own query blocks and every key block, equal diffusers' whole
    mask's rows (4 heads, 8 blocks, cp = 4, a threshold that keeps a few blocks a row); built from the rank's own
    key blocks only (the negative control) they do not."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 512, 4, 16, generator=g), torch.randn(2, 512, 4, 16, generator=g)
    sta = torch.eye(8, dtype=torch.bool)
    whole = nabla_block_mask(q.transpose(1, 2), k.transpose(1, 2), sta, thr=0.5).to_dense().bool()  # [B, H, 8, 8]
    rows = [
        mask_rows(block_means(q[:, 128 * r : 128 * (r + 1)]), block_means(k), sta[2 * r : 2 * r + 2], 0.5)
        for r in range(4)
    ]
    assert torch.equal(torch.cat(rows, dim=2), whole)
    assert 0 < int(whole.sum()) < whole.numel()  # the threshold really chooses
    own = mask_rows(block_means(q[:, 128:256]), block_means(k[:, 128:256]), sta[2:4, 2:4], 0.5)
    assert not torch.equal(own, whole[..., 2:4, 2:4])


def test_gathered_kind_is_checked():
    """An unknown `cp.gathered` kind is a PlanError naming the known ones."""
    data = {"split": {"": {"x": {"dim": 1}}}, "gather": {"out": {"dim": 1}}, "gathered": {"blocks.*.mlp": "topk"}}
    with pytest.raises(dtp.PlanError, match="expert_choice"):
        cp_plan_from_mapping(data, "p")


def test_gathered_binds_the_moe_layers_only():
    """Nucleus-Image's `gathered` glob covers every block's img_mlp; only the MoE ones (block 1 of the tiny model) get
    the CP forward; with moe_enabled=False none does, and the plan still binds."""
    plan, cls = dtp.load_plan("nucleusmoe"), PLAN_CLASSES["nucleusmoe"]
    model = tiny_model(cls)
    assert resolve_cp(resolve(plan, model), model).gathered == (("transformer_blocks.1.img_mlp", "expert_choice"),)
    dense = tiny_model(cls, moe_enabled=False)
    assert resolve_cp(resolve(plan, dense), dense).gathered == ()
    wrong = dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, gathered=(("transformer_blocks.*.mlp", "x"),)))
    with pytest.raises(dtp.PlanError):
        resolve_cp(resolve(wrong, model), model)
