"""Issue 10 plan features, resolved without processes: `optional` keys, kv heads, `rmsnorm_across_heads`,
`shard_output`, and every coverage plan's TP degrees at full size (class defaults, meta device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import dtp
from dtp.analysis.fakepg import meta_model
from dtp.errors import ForwardError
from dtp.plan import Style, bundled_plan_names, load_plan
from dtp.resolve import resolve
from dtp.resolve.binding.heads import derived_kv_heads
from dtp.resolve.transforms.kv_share import share_kv
from dtp.runtime.outputs import _cut
from dtp.testing.tiny import tiny_model

SD3, LUMINA2, WAN = "SD3Transformer2DModel", "Lumina2Transformer2DModel", "WanTransformer3DModel"


def _without(plan, predicate):
    return dataclasses.replace(plan, rules=tuple(r for r in plan.rules if not predicate(r)))


def _with_rule(plan, key, value):
    extra = dtp.Plan.from_dict({key: value}).rules
    return dataclasses.replace(plan, rules=plan.rules + extra)


# ---- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, match",
    [
        ({"style": "rowwise", "optional": "yes"}, "must be true or false"),
        ({"style": "shard_output"}, "needs an integer `dim`"),
        ({"style": "colwise", "dim": 0}, "needs an integer `dim`"),
        ({"style": "shard_output", "dim": "last"}, "needs an integer `dim`"),
        ({"style": "rowwise", "bogus": 1}, "takes `style`"),
    ],
)
def test_malformed_rule_mappings_are_plan_errors(value, match):
    with pytest.raises(dtp.PlanError, match=match):
        dtp.Plan.from_dict({"blocks.*.attn.to_out": value})


def test_new_styles_parse():
    plan = dtp.Plan.from_dict(
        {"b.*.norm_q": "rmsnorm_across_heads", "rope": {"style": "shard_output", "dim": -2}, "b.*.o": "rowwise"}
    )
    assert [(r.style, r.dim) for r in plan.rules] == [
        (Style.RMSNORM_ACROSS_HEADS, None),
        (Style.SHARD_OUTPUT, -2),
        (Style.ROWWISE, None),
    ]


# ---- optional members (SD3: context-only last block, dual attention in block 0 only) --------------


def test_optional_skips_exactly_the_blocks_that_lack_the_member():
    """Tiny SD3 has 3 blocks; the last is context-only (no to_add_out, no ff_context) and only block 0 has attn2."""
    resolved = resolve(dtp.load_plan("sd3"), tiny_model(SD3))
    paths = {spec.path for spec in resolved.linears}
    assert {f"transformer_blocks.{i}.attn.to_add_out" for i in range(3)} & paths == {
        "transformer_blocks.0.attn.to_add_out",
        "transformer_blocks.1.attn.to_add_out",
    }
    assert {p for p in paths if ".attn2." in p} == {
        f"transformer_blocks.0.attn2.{name}" for name in ("to_q", "to_k", "to_v", "to_out.0")
    }
    assert "transformer_blocks.2.ff_context.net.2" not in paths


def test_without_optional_a_none_member_is_a_plan_error():
    plan = dtp.load_plan("sd3")
    plan = _without(plan, lambda r: r.key == "transformer_blocks.*.attn.to_add_out")
    plan = _with_rule(plan, "transformer_blocks.*.attn.to_add_out", "rowwise")
    with pytest.raises(dtp.PlanError, match=r"transformer_blocks.2.attn.to_add_out' is None.*optional: true"):
        resolve(plan, tiny_model(SD3))


def test_optional_does_not_hide_a_wrong_path():
    plan = _with_rule(
        dtp.load_plan("sd3"), "transformer_blocks.*.attn.to_add_outt", {"style": "rowwise", "optional": True}
    )
    with pytest.raises(dtp.PlanError, match="'transformer_blocks.0.attn.to_add_outt' does not exist, and no code"):
        resolve(plan, tiny_model(SD3))


def test_optional_member_none_everywhere_is_fine():
    """SD3.5-Large has no dual-attention block: the attn2 rules match nothing, deliberately."""
    resolved = resolve(dtp.load_plan("sd3"), tiny_model(SD3, dual_attention_layers=()))
    assert not [spec for spec in resolved.linears if ".attn2." in spec.path]
    assert resolved.candidates() == [1, 2, 4]


# ---- kv heads (Lumina2 tiny: 8 q / 4 kv heads of 8) ------------------------------------------------


def test_kv_heads_are_shared_where_tp_exceeds_them():
    """tp=8 > 4 kv heads: each kv head is held whole by 2 ranks (kv_share.py, the rule transformers attention
    uses); the processor derives 1 local kv head from the local k width. Parity: test_cp_coverage.py."""
    model = tiny_model(LUMINA2)
    resolved = resolve(dtp.load_plan("lumina2"), model)
    kv = [c for c in resolved.constraints if c.what.startswith("kv heads")]
    assert kv and {c.value for c in kv} == {4} and all(c.shareable for c in kv)
    assert all(c.value % 8 == 0 for c in resolved.constraints if c not in kv)  # widths and q heads allow 8
    assert resolved.candidates() == [1, 2, 4, 8]
    shared = share_kv(resolved, model, 8)
    assert {spec.kv_replicas for spec in shared.attention} == {2}
    assert {s.replicas for s in shared.linears if s.path.endswith(("attn.to_k", "attn.to_v"))} == {2}


@given(st.integers(1, 8), st.integers(1, 8), st.sampled_from([2, 4, 8, 16]))
def test_derived_kv_heads_match_the_configured_count(kv_heads, group, head_dim):
    """diffusers Attention with `kv_heads`: the derived count is the configured one whenever k is narrower."""
    from diffusers.models.attention_processor import Attention

    heads = kv_heads * group
    assume(group > 1)
    with torch.device("meta"):
        attn = Attention(query_dim=32, heads=heads, kv_heads=kv_heads, dim_head=head_dim)
    assert derived_kv_heads(attn) == kv_heads


def test_no_kv_constraint_without_gqa():
    from diffusers.models.attention_processor import Attention

    with torch.device("meta"):
        assert derived_kv_heads(Attention(query_dim=32, heads=4, dim_head=8)) is None


# ---- rmsnorm_across_heads ---------------------------------------------------------------------------


def test_norms_resolve_with_the_true_width_and_shard_like_the_heads():
    resolved = resolve(dtp.load_plan("wan"), tiny_model(WAN))
    assert len(resolved.norms) == 8  # 2 blocks x (attn1, attn2) x (norm_q, norm_k)
    assert {spec.width for spec in resolved.norms} == {64}
    layouts = resolved.param_layouts()
    assert layouts["blocks.0.attn1.norm_q.weight"] == dtp.resolve.Layout(0, (64,))  # the loader reads slices


def test_an_unplanned_norm_across_heads_is_refused():
    """Wan with its QK-norms left replicated: a PlanError before anything runs, naming the norm."""
    plan = _without(dtp.load_plan("wan"), lambda r: r.style is Style.RMSNORM_ACROSS_HEADS)
    with pytest.raises(dtp.PlanError, match=r"blocks.0.attn1.norm_q' \(RMSNorm\) normalizes 64 features"):
        resolve(plan, tiny_model(WAN))


def test_a_per_head_norm_is_not_an_across_heads_norm():
    """SD3's QK-norm normalizes head_dim (16), not a sharded width (64): planning it as across-heads is refused."""
    plan = _with_rule(dtp.load_plan("sd3"), "transformer_blocks.*.attn.norm_q", "rmsnorm_across_heads")
    with pytest.raises(dtp.PlanError, match="normalizes 16 features but no colwise Linear"):
        resolve(plan, tiny_model(SD3))


def test_across_heads_style_on_a_linear_is_refused():
    plan = _with_rule(dtp.load_plan("wan"), "proj_out", "rmsnorm_across_heads")
    with pytest.raises(dtp.PlanError, match="'proj_out' is a Linear; 'rmsnorm_across_heads' applies to RMSNorm"):
        resolve(plan, tiny_model(WAN))


# ---- shard_output ------------------------------------------------------------------------------------


def test_shard_output_refuses_a_module_with_weights():
    plan = _with_rule(dtp.load_plan("wan"), "proj_out", {"style": "shard_output", "dim": -1})
    with pytest.raises(dtp.PlanError, match="has parameters"):
        resolve(plan, tiny_model(WAN))


@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=4),
    st.integers(-4, 3),
    st.sampled_from([1, 2, 4]),
    st.data(),
)
def test_cut_is_torch_chunk(shape, dim, tp, data):
    """Each rank keeps `torch.chunk(x, tp, dim)[rank]` of every output tensor, tuples included."""
    assume(-len(shape) <= dim < len(shape))
    shape[dim] *= tp  # the size along `dim` divides tp
    x = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    rank = data.draw(st.integers(0, tp - 1))
    spec = dataclasses.make_dataclass("S", ["dim", "path", "rule"])(dim, "rope", None)
    cos, sin = _cut((x, x + 1), spec, tp, rank)
    assert torch.equal(cos, torch.chunk(x, tp, dim)[rank]) and torch.equal(sin, torch.chunk(x + 1, tp, dim)[rank])


def test_cut_refuses_an_indivisible_size():
    spec = dataclasses.make_dataclass("S", ["dim", "path", "rule"])(-1, "rope", type("R", (), {"key": "rope"}))
    with pytest.raises(ForwardError, match="size 6 is not divisible by tp=4"):
        _cut(torch.ones(2, 6), spec, 4, 0)


# ---- full size (class defaults + each family's RELEASED (dtp/families/)), meta device -------------------

# The degrees follow from the heads (and kv heads): e.g. Wan 14B 40 heads -> 1, 2, 4, 8 (FFN 13824 =
# 2^9 * 27 allows 8); SD3 class defaults 18 heads; HunyuanImage 28; AuraFlow 12; HiDream 20 (and
# 4 experts of 6912); Sana 70 self / 20 cross heads -> 1, 2, 5, 10; Lumina2 24 q / 8 kv heads -> 8 at most.
FULL_SIZE_TP = {
    "auraflow": [1, 2, 4],
    "chroma": [1, 2, 4, 8],
    "cogvideox": [1, 2, 3, 5, 6, 10, 15, 30],
    "cogview4": [1, 2, 4, 8, 16, 32, 64],
    "cosmos": [1, 2, 4, 8, 16, 32],
    "hidream": [1, 2, 4],
    "hunyuanimage": [1, 2, 4, 7, 14, 28],
    "hunyuanvideo": [1, 2, 3, 4, 6, 8, 12, 24],
    "ltx_video": [1, 2, 4, 8, 16, 32],
    "lumina2": [1, 2, 4, 8, 24],  # 24 q / 8 kv heads: at tp=24 each kv head is shared by 3 ranks
    "mochi": [1, 2, 4, 8],
    "pixart": [1, 2, 4, 8, 16],
    "qwenimage21": [1, 2, 4, 8, 16, 32],
    "sana": [1, 2, 5, 10],
    "sd3": [1, 2, 3, 6, 9, 18],
    "skyreels_v2": [1, 2, 4, 8, 16],
    "wan": [1, 2, 4, 8],
}


@pytest.mark.parametrize("name", sorted(FULL_SIZE_TP))
def test_full_size_tp_candidates(name):
    plan = dtp.load_plan(name)
    (class_name,) = plan.models
    assert dtp.tp_candidates(meta_model(class_name), plan) == FULL_SIZE_TP[name]


def test_every_bundled_plan_has_a_parity_test_and_a_table_row():
    """Each bundled plan is run by a gloo parity module (earlier four: test_tp_parity_*; the rest:
    test_coverage_parity*) and listed in the generated coverage table (rerun benchmarks/coverage_table.py)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests" / "distributed"))
    try:
        from coverage_cases import COVERAGE_PLANS, EARLIER_PLANS
        from tp_cases import PLANS
    finally:
        sys.path.pop(0)
    import diffusers

    # DiT plans only: text-encoder plans (transformers classes) have their own parity modules.
    names = {n for n in bundled_plan_names() if any(hasattr(diffusers, m) for m in load_plan(n).models)}
    assert set(EARLIER_PLANS) == set(PLANS)
    assert names == set(COVERAGE_PLANS) | set(PLANS)
    readme = (root / "README.md").read_text()
    assert [n for n in sorted(names) if f"| `{n}` |" not in readme] == [], "add the plan to the README's table"
    table = (root / "benchmarks" / "results" / "coverage.md").read_text()
    assert [n for n in sorted(names) if f"plans/{n}.yaml" not in table] == []
