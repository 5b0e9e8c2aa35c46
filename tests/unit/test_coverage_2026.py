"""Issue 35 without processes: the held-size check, and the new plans' weights per rank at full size (meta)."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
from dtp.analysis.fakepg import meta_model
from dtp.analysis.suggest import rank_fraction
from dtp.plan import Rule, Style
from dtp.resolve import resolve
from dtp.resolve.binding.held_sizes import check_held_sizes
from dtp.testing.tiny import PLAN_CLASSES, tiny_model

# `dtp check <class> --tp 8` at full size (released config, bf16), measured: FLUX.3 1.014, LTX-2 1.044,
# HunyuanVideo 1.5 1.037, Wan VACE 1.032, Wan Animate 1.021, Helios 1.013, CogView3-Plus 1.033; NucleusMoE 1.025,
# MiniMax-H3 1.010, Allegro 1.017, EasyAnimate 1.009, Motif-Video 1.019, JoyImage Edit 1.018
# (Plus: 1.018), Kandinsky 5 1.030.
FULL_SIZE = ("flux3", "ltx2", "hunyuanvideo15", "wan_vace", "wan_animate", "helios", "cogview3plus")
# Round 8 (image models), measured: Bria FIBO 1.000, GLM-Image 1.001, ERNIE-Image 1.002 (DTP_FULL=1).
FULL_SIZE_ROUND8 = ("bria_fibo", "glm_image", "ernie_image")
FULL_SIZE += ("nucleusmoe",)
# Round 8's other video families repeat covered kinds: their full-size checks run with DTP_FULL=1.
FULL_SIZE_FULL = ("minimax_h3", "allegro", "easyanimate", "motif_video", "joyimage_edit", "joyimage_edit_plus")
FULL_SIZE_FULL += ("kandinsky5", *FULL_SIZE_ROUND8)
# Round 9, measured: Kandinsky 6 1.006, Cosmos 3 Omni 1.009, AnyFlow 1.025 (Kandinsky 6 SR: 28 heads, tp=7 1.011,
# tp=8 only with pad 1.055).
FULL_SIZE_FULL += ("kandinsky6", "cosmos3_omni", "anyflow")


@pytest.mark.parametrize("name", [*FULL_SIZE, *(pytest.param(name, marks=pytest.mark.full) for name in FULL_SIZE_FULL)])
def test_full_size_weights_per_rank_within_5_percent_of_ideal(name):
    """Released config on meta, tp=8: one rank's weight bytes <= 1.05 x total / 8."""
    model = meta_model(PLAN_CLASSES[name], dtype=torch.bfloat16)
    ratio = rank_fraction(model, dtp.load_plan(name), 8) * 8
    assert ratio <= 1.05, ratio


def _ovis_with_sharded_mlp():
    plan = dtp.load_plan("ovisimage")
    rules = [r for r in plan.rules if r.key != "single_transformer_blocks.*.proj_mlp"]
    rules.append(Rule("single_transformer_blocks.*.proj_mlp", Style("packed_colwise"), blocks=(1, 1)))
    rules.append(Rule("single_transformer_blocks.*.proj_out", Style("packed_rowwise"), blocks=(1, 4)))
    rules += [Rule(f"single_transformer_blocks.*.attn.to_{p}", Style("colwise")) for p in "qkv"]
    return dataclasses.replace(plan, rules=tuple(rules), attention=None)


def test_held_size_refused_naming_the_attribute():
    """OvisImage's single blocks read self.mlp_hidden_dim in torch.split: sharding proj_mlp is refused, naming
    the attribute, its value, the Linear and the fix."""
    model = tiny_model("OvisImageTransformer2DModel")
    with pytest.raises(dtp.PlanError) as info:
        check_held_sizes(resolve(_ovis_with_sharded_mlp(), model), model)
    message = str(info.value)
    assert "single_transformer_blocks.0.mlp_hidden_dim' = 256" in message
    assert "single_transformer_blocks.0.proj_mlp" in message and "colwise_gathered" in message


@pytest.mark.parametrize("name", sorted(PLAN_CLASSES))
def test_bundled_plans_hold_no_read_size(name):
    """No bundled plan trips the check (FLUX.1 holds mlp_hidden_dim too, but never reads it after __init__)."""
    model = tiny_model(PLAN_CLASSES[name])
    check_held_sizes(resolve(dtp.load_plan(name), model), model)


class _Chunks(nn.Module):
    """A block holding `size` that cuts its Linear's output by chunk(2) (FLUX.1's pattern: the size unread)."""

    def __init__(self, dim: int, size: int):
        super().__init__()
        self.size = size
        self.up = nn.Linear(dim, 2 * size)
        self.down = nn.Linear(size, dim)

    def forward(self, x):
        a, b = self.up(x).chunk(2, dim=-1)
        return self.down(a * b)


class _Reads(_Chunks):
    """The same block cutting by the size it holds (OvisImage's pattern)."""

    def forward(self, x):
        a, b = torch.split(self.up(x), [self.size, self.size], dim=-1)
        return self.down(a * b)


@settings(max_examples=25, deadline=None)
@given(dim=st.sampled_from([8, 12, 16]), size=st.sampled_from([4, 8, 24]), reads=st.booleans())
def test_refused_exactly_when_the_block_reads_a_sharded_width(dim, size, reads):
    """Refused iff the block reads `size` (a packed block of up's output); the input width never counts."""
    model = nn.Sequential((_Reads if reads else _Chunks)(dim, size))
    plan = dtp.Plan.from_dict({"tp": {"0.up": {"style": "packed_colwise", "blocks": [1, 1]}, "0.down": "rowwise"}})
    resolved = resolve(plan, model)
    if reads and size != dim:
        with pytest.raises(dtp.PlanError, match="'0.size'"):
            check_held_sizes(resolved, model)
    else:
        check_held_sizes(resolved, model)


def test_layer_pre_norms_are_not_taken_for_norms_across_heads():
    """Wan Animate's face adapters normalize their inputs with LayerNorms as wide as q (dim = heads x head_dim): the
    plan resolves. In the same model an RMSNorm across heads left out of the plan (attn2.norm_added_k, the image
    branch's k norm) is still refused, naming it (the check is narrowed to the norms the style can plan)."""
    model, plan = tiny_model("WanAnimateTransformer3DModel"), dtp.load_plan("wan_animate")
    resolved = resolve(plan, model)
    assert "face_adapter.0.to_q" in {spec.path for spec in resolved.linears}
    missing = dataclasses.replace(plan, rules=tuple(r for r in plan.rules if not r.key.endswith("norm_added_k")))
    with pytest.raises(dtp.PlanError, match=r"'blocks.0.attn2.norm_added_k' \(RMSNorm\) normalizes 64 features"):
        resolve(missing, model)


# Every bundled plan takes cp since issue 45 (Nucleus-Image and Kandinsky 6 SR in tests/distributed/test_cp_route.py,
# Kandinsky 6 and Cosmos 3 Omni in test_cp_video.py, OmniGen under Ulysses in test_cp_omnigen.py): the `cp: refused`
# mechanism is checked on a plan given one.
CP_REFUSED = {"omnigen": "a made-up reason: no exact scheme"}


@pytest.mark.parametrize("name", sorted(CP_REFUSED))
def test_cp_refusal_names_the_reason(fake_world, name):
    """prepare at cp=4 raises the plan header's reason before anything is sharded."""
    from dtp.plan.cp import CpPlan

    model, plan = tiny_model(PLAN_CLASSES[name]), dtp.load_plan(name)
    plan = dataclasses.replace(plan, cp=CpPlan(splits=(), gathers=(), refused=CP_REFUSED[name]))
    with pytest.raises(dtp.PlanError, match=CP_REFUSED[name]):
        dtp.prepare(model, dtp.make_mesh(cp=4, tp=1, device_type="cpu"), plan)


def test_num_heads_attention_gets_per_rank_counts():
    """Krea2Attention keeps `num_heads` / `num_kv_heads` (no `heads`): resolved at tp=4 its 8 q / 4 kv heads become
    2 / 1 per rank (tiny), both rewritten; a module with `num_heads` but no processor is no attention module."""
    from dtp.resolve.binding.heads import query_heads

    model = tiny_model("Krea2Transformer2DModel")
    spec = next(s for s in resolve(dtp.load_plan("krea2"), model).attention if s.path == "transformer_blocks.0.attn")
    assert spec.local_values(4) == {"num_heads": 2, "num_kv_heads": 1}
    pool = nn.Module()
    pool.num_heads = 8  # HunyuanDiT's T5 pooler keeps num_heads and calls F.multi_head_attention_forward itself
    assert query_heads(pool) is None and query_heads(model.transformer_blocks[0].attn) == 8


def test_num_attention_heads_attention_gets_per_rank_counts():
    """Cosmos3PackedMoTAttention keeps `num_attention_heads` / `num_key_value_heads` (GQA, no `heads`): resolved at
    tp=4 its 8 q / 4 kv heads become 2 / 1 per rank (tiny), both rewritten; `num_key_value_groups` (their ratio)
    stays."""
    model = tiny_model("Cosmos3OmniTransformer")
    spec = next(s for s in resolve(dtp.load_plan("cosmos3_omni"), model).attention if s.path == "layers.0.self_attn")
    assert spec.local_values(4) == {"num_attention_heads": 2, "num_key_value_heads": 1}


def test_easyanimate_shared_blocks_are_refused_naming_the_text_projection():
    """EasyAnimate blocks past `mmdit_layers` return the text's attention output unprojected (this rank's heads only
    under tp): the plan's text keys are required, so such a config is refused before anything is sharded."""
    model = tiny_model("EasyAnimateTransformer3DModel", mmdit_layers=1)
    with pytest.raises(dtp.PlanError, match=r"'transformer_blocks.1.attn1.add_q_proj' is None"):
        resolve(dtp.load_plan("easyanimate"), model)


def test_motif_single_block_cross_attention_is_refused_before_sharding(fake_world):
    """Motif-Video's single-block text cross-attention takes the attention output before proj_out (this rank's heads
    under tp) as its query input: prepare refuses such a config at tp=4 (the flow check), naming the cross-attention."""
    model = tiny_model("MotifVideoTransformer3DModel", enable_text_cross_attention_single=True)
    with pytest.raises(dtp.PlanError, match=r"single_transformer_blocks\.0\.cross_attn"):
        dtp.prepare(model, dtp.make_mesh(tp=4, device_type="cpu"), dtp.load_plan("motif_video"))
