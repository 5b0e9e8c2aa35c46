"""The pair rule around attention: q/k/v feed the attention op (any widths, GQA), its output the out projection."""

import pytest
from torch import nn

import dtp
from dtp.resolve import resolve


class GqaAttention(nn.Module):
    """diffusers-style attention with 4 query heads and 2 kv heads of width 8."""

    def __init__(self, heads=4, kv_heads=2, head_dim=8):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.to_q = nn.Linear(32, heads * head_dim)
        self.to_k = nn.Linear(32, kv_heads * head_dim)
        self.to_v = nn.Linear(32, kv_heads * head_dim)
        self.to_out = nn.ModuleList([nn.Linear(heads * head_dim, 32)])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = GqaAttention()
        self.proj = nn.Linear(32, 24)  # not under attention: its width must pair


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])


QKVO = {
    "blocks.*.attn.to_q": "colwise",
    "blocks.*.attn.to_k": "colwise",
    "blocks.*.attn.to_v": "colwise",
    "blocks.*.attn.to_out.0": "rowwise",
}


def test_gqa_kv_projections_pair_through_attention():
    resolved = resolve(dtp.Plan.from_dict(QKVO), Model())
    assert [a.path for a in resolved.attention] == ["blocks.0.attn", "blocks.1.attn"]
    assert resolved.candidates() == [1, 2]  # kv_heads = 2 limits tp
    with pytest.raises(dtp.PlanError, match="tp=4 does not divide kv_heads of blocks.0.attn=2"):
        resolved.check_tp(4)


def test_kv_projection_without_an_out_projection_is_refused():
    plan = {k: v for k, v in QKVO.items() if "to_out" not in k}
    with pytest.raises(dtp.PlanError, match="no rowwise layer"):
        resolve(dtp.Plan.from_dict(plan), Model())


def test_a_colwise_outside_attention_still_needs_a_matching_width():
    plan = {**QKVO, "blocks.*.proj": "colwise"}
    with pytest.raises(dtp.PlanError, match="width 24 of 'blocks.0.proj' .* matches no rowwise width"):
        resolve(dtp.Plan.from_dict(plan), Model())
