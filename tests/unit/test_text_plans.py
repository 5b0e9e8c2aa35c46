"""Text-encoder plans: transformers' vocabulary translated or refused, plan_for by library, checks before mutation."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_bad_plans import assert_unchanged, snapshot
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
from transformers.distributed.tensor_parallel import is_torch_distributed_available

import dtp
from dtp.families.released_pipelines import GEMMA3_12B, QWEN3_VL_4B
from dtp.plan import Style
from dtp.plan.transformers import DROPPED, TRANSLATED, translate
from dtp.resolve import Layout, resolve
from dtp.resolve.transforms.kv_share import share_kv
from dtp.resolve.transforms.padding import pad_resolved
from dtp.testing.plans import edited
from dtp.testing.tiny_text import TEXT_CLASSES, tiny_grouped_qwen, tiny_text_model
from dtp.testing.tiny_vision import (
    GEMMA3,
    MISTRAL3,
    QWEN3_VL,
    QWEN_VL,
    meta_vision_model,
    tiny_vision_model,
    vision_bytes,
)

assert is_torch_distributed_available()  # transformers registers its TP styles only then
TRANSFORMERS_STYLES = sorted(ALL_PARALLEL_STYLES.keys())
BUNDLED = {
    "T5EncoderModel": "t5",
    "UMT5EncoderModel": "umt5",
    "CLIPTextModel": "clip",
    "CLIPTextModelWithProjection": "clip-projection",
    "LlamaModel": "llama",
    "LlamaForCausalLM": "llama-causal-lm",
    "Qwen3Model": "qwen3",
    "Gemma2Model": "gemma2",
    "GlmModel": "glm",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2_5_VLTextModel": "qwen2_5_vl_text",
    "Mistral3ForConditionalGeneration": "mistral3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
}


@pytest.fixture(scope="module")
def mesh2(fake_world):
    return dtp.make_mesh(tp=2, cp=2, device_type="cpu")


@pytest.fixture(scope="module")
def mesh4(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


def test_the_translation_table_knows_transformers_styles():
    """Every name in the table is one transformers registers (a renamed style would silently never match)."""
    assert set(TRANSLATED) | DROPPED <= set(TRANSFORMERS_STYLES)


@given(st.sampled_from(TRANSFORMERS_STYLES), st.from_regex(r"layers\.\*\.[a-z_]{1,8}", fullmatch=True))
def test_every_transformers_style_is_translated_dropped_or_refused_by_key(style, key):
    plan_dict = {"layers.*.q_proj": "colwise", key: style}
    if style in TRANSLATED or style in DROPPED:
        plan = translate(plan_dict, "p")
        assert [r.key for r in plan.rules] == ["layers.*.q_proj"] + ([key] if style in TRANSLATED else [])
    else:
        with pytest.raises(dtp.PlanError, match=rf"key '{key.replace('.', '[.]').replace('*', '[*]')}'.*{style}"):
            translate(plan_dict, "p")


def test_translation_of_the_exact_styles():
    plan = translate(
        {
            "embed_tokens": "embedding_rowwise",
            "lm_head": "colwise_gather_output",
            "layers.*.mlp.gate_up_proj": "packed_colwise",
            "layers.*.self_attn.q_norm": "replicated_with_grad_allreduce",
        },
        "p",
    )
    styles = {r.key: (r.style, r.blocks) for r in plan.rules}
    assert styles == {
        "embed_tokens": (Style.VOCAB_PARALLEL, None),
        "lm_head": (Style.COLWISE_GATHERED, None),
        "layers.*.mlp.gate_up_proj": (Style.PACKED_COLWISE, (1, 1)),
    }


@pytest.mark.parametrize("cls", TEXT_CLASSES)
def test_plan_for_picks_the_bundled_text_plan(cls):
    assert dtp.plan_for(tiny_text_model(cls)) == dtp.load_plan(BUNDLED[cls])


def test_plan_for_translates_a_transformers_class_plan(monkeypatch):
    """The issue's report: Qwen2.5-VL's class `_tp_plan` (`colwise_gather_output`) is no diffusers plan."""
    model = tiny_text_model("Qwen2_5_VLForConditionalGeneration")
    monkeypatch.setattr("dtp.plan.io.bundled_plan_names", lambda: ["flux"])  # no bundled text plan
    plan = dtp.plan_for(model)
    styles = {r.key: r.style for r in plan.rules}
    assert styles["lm_head"] is Style.COLWISE_GATHERED
    assert styles["model.language_model.embed_tokens"] is Style.VOCAB_PARALLEL
    assert resolve(plan, model).candidates() == [1, 2, 4]  # 4 query heads; 2 kv heads shared at tp=4


def test_plan_for_reads_no_plan_from_an_attribute_alone():
    """A `_tp_plan` on a class that is neither a diffusers nor a transformers model is not trusted."""

    class Custom(torch.nn.Module):
        _tp_plan = {"proj": "colwise"}

    with pytest.raises(dtp.PlanError, match="no plan for Custom"):
        dtp.plan_for(Custom())


def test_glm_transformers_plan_refuses_rowwise_split_input():
    model = tiny_text_model("GlmModel")
    with pytest.raises(dtp.PlanError, match=r"key 'layers\.\*\.mlp\.down_proj'.*'rowwise_split_input'"):
        translate(model._tp_plan, "glm")


def raises_and_unchanged(model, mesh, plan, match):
    before = snapshot(model)
    with pytest.raises(dtp.PlanError, match=match):
        dtp.parallelize(model, mesh, plan)
    assert_unchanged(model, before)


def test_kv_heads_shared_when_tp_exceeds_them():
    """4 query / 2 kv heads: tp=4 shares each kv head between 2 ranks; 3 neither divides nor is divided by 2."""
    model = tiny_text_model("LlamaModel")
    resolved = resolve(dtp.plan_for(model), model)
    assert resolved.candidates() == [1, 2, 4]
    shared = share_kv(resolved, model, 4)
    layouts = {s.path: s.weight_layout for s in shared.linears}
    assert layouts["layers.0.self_attn.k_proj"].replicas == 2 and layouts["layers.0.self_attn.v_proj"].replicas == 2
    assert layouts["layers.0.self_attn.q_proj"].groups == 2 and layouts["layers.0.self_attn.o_proj"].groups == 2
    attention = shared.attention[0]
    assert attention.local_values(4) == {"num_key_value_groups": 1}  # 1 query head over 1 (shared) kv head
    assert share_kv(resolved, model, 2) is resolved  # tp=2 divides the kv heads: nothing shared


def test_shared_kv_rank_pieces():
    """tp=4, 2 kv heads of width 8: ranks 0, 1 hold kv head 0 (rows 0:8), ranks 2, 3 kv head 1 (rows 8:16)."""
    layout = Layout(0, (16,), replicas=2)
    weight = torch.arange(16.0).unsqueeze(1)
    pieces = [layout.local_slice(weight, 4, rank) for rank in range(4)]
    assert [p.flatten().tolist() for p in pieces] == [list(range(8))] * 2 + [list(range(8, 16))] * 2
    assert torch.equal(layout.assemble(pieces), weight)


def test_kv_heads_neither_dividing_nor_divided_are_refused(mesh4):
    """6 query / 2 kv heads (Qwen2.5-VL's 28 / 4 in small) at tp=4: the 6 query heads do not divide; pad=True
    pads each group of 3 to 4, so each rank holds 2 query heads of one group."""
    model = tiny_grouped_qwen()
    raises_and_unchanged(model, mesh4, None, r"tp=4 does not divide .*=6 .*pad=True")


def test_grouped_padding_layouts():
    """pad=True at tp=4: q 6 heads -> 2 groups of 4 heads (8 x 8 rows), o the same columns, k/v shared."""
    model = tiny_grouped_qwen()
    resolved = resolve(dtp.plan_for(model), model)
    padded = share_kv(pad_resolved(resolved, model, 4).resolved, model, 4)
    layouts = {s.path: s.weight_layout for s in padded.linears}
    attn = "model.language_model.layers.0.self_attn"
    assert layouts[f"{attn}.q_proj"] == Layout(0, (48,), (64,), groups=2)
    assert layouts[f"{attn}.o_proj"] == Layout(1, (48,), (64,), groups=2)
    assert layouts[f"{attn}.k_proj"] == Layout(0, (16,), (16,), replicas=2)
    # rank 1: heads 2 of group 0 and a zero head -> rows 16:24 then 8 zeros
    assert layouts[f"{attn}.q_proj"].local_slice(torch.arange(48.0), 4, 1).tolist() == [*range(16, 24)] + [0.0] * 8
    spec = next(s for s in padded.attention if s.path == attn)
    assert spec.local_values(4) == {"num_heads": 2, "num_key_value_heads": 1, "num_key_value_groups": 2}


def test_vocab_parallel_needs_an_embedding(mesh2):
    plan = dtp.Plan.from_dict({"layers.*.self_attn.q_proj": "vocab_parallel"})
    raises_and_unchanged(tiny_text_model("LlamaModel"), mesh2, plan, r"'layers\.0\.self_attn\.q_proj' is a Linear")


def test_colwise_needs_a_linear(mesh2):
    plan = dtp.Plan.from_dict({"embed_tokens": "colwise"})
    raises_and_unchanged(
        tiny_text_model("LlamaModel"), mesh2, plan, r"'embed_tokens' is a Embedding, not an nn\.Linear"
    )


def test_embedding_colwise_only_for_per_head_tables(mesh2):
    plan = dtp.Plan.from_dict({"embed_tokens": "embedding_colwise"})
    raises_and_unchanged(tiny_text_model("LlamaModel"), mesh2, plan, r"'<model>' is no attention module")


def test_embedding_with_max_norm_is_refused(mesh2):
    model = tiny_text_model("LlamaModel")
    model.embed_tokens.max_norm = 1.0
    plan = dtp.Plan.from_dict({"embed_tokens": "vocab_parallel"})
    raises_and_unchanged(model, mesh2, plan, r"max_norm=1\.0")


def test_a_tied_weight_left_whole_is_refused(mesh2):
    """T5's `shared` and `encoder.embed_tokens` are one Parameter: sharding one alone saves nothing."""
    plan = dtp.Plan.from_dict({"shared": "vocab_parallel"})
    raises_and_unchanged(
        tiny_text_model("T5EncoderModel"), mesh2, plan, r"'shared\.weight' is tied to 'encoder\.embed_tokens\.weight'"
    )


def test_tied_weights_stay_one_parameter(mesh2):
    model = dtp.parallelize(tiny_text_model("T5EncoderModel"), mesh2["tp"])
    assert model.shared.weight is model.encoder.embed_tokens.weight
    assert model.shared.weight.to_local().shape == (32, 32)  # 64 vocabulary rows / 2


def test_t5_heads_become_local(mesh2):
    model = dtp.parallelize(tiny_text_model("T5EncoderModel"), mesh2["tp"])
    attn = model.encoder.block[0].layer[0].SelfAttention
    assert (attn.n_heads, attn.inner_dim) == (2, 16)
    assert attn.relative_attention_bias.weight.to_local().shape == (8, 2)  # 8 buckets x this rank's 2 heads


# The released vision_configs (as in benchmarks/pipeline_memory.py): Qwen/Qwen2.5-VL-7B-Instruct (Qwen-Image's
# text encoder) and mistralai/Mistral-Small-3.1-24B-Instruct-2503 (FLUX.2-dev's).
QWEN_VL_7B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
    fullatt_block_indexes=[7, 15, 23, 31],
)  # fmt: skip
PIXTRAL_SMALL_3_1 = dict(
    hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, head_dim=64,
    image_size=1540, patch_size=14,
)  # fmt: skip


def test_qwen2_5_vl_vision_qkv_keeps_this_rank_s_heads_of_q_k_and_v(mesh2):
    """The fused qkv [q; k; v] (3 x 32 rows, 4 heads of 8) at tp=2: rank 0 holds q, k and v rows 0-15 each."""
    qkv = tiny_vision_model(QWEN_VL).model.visual.blocks[0].attn.qkv
    expected = [torch.cat([part.chunk(2)[0] for part in tensor.chunk(3)]) for tensor in (qkv.weight, qkv.bias)]
    attn = dtp.parallelize(tiny_vision_model(QWEN_VL), mesh2["tp"]).model.visual.blocks[0].attn
    assert attn.num_heads == 2  # the reshape of the fused qkv output reads it
    assert torch.equal(attn.qkv.weight.to_local(), expected[0])
    assert torch.equal(attn.qkv.bias.to_local(), expected[1])


def test_qwen2_5_vl_vision_qkv_as_one_colwise_block_is_refused(mesh2):
    """Plain colwise would give rank 0 q's rows only, as its "q, k, v": attn.proj's width 32 exposes it."""
    plan = edited(
        dtp.load_plan("qwen2_5_vl"),
        {"model.visual.blocks.*.attn.qkv": "colwise"},
        attention=["model.language_model.layers.*.self_attn", "model.visual.blocks.*.attn"],
    )
    raises_and_unchanged(
        tiny_vision_model(QWEN_VL), mesh2["tp"], plan, r"width 32 of 'model\.visual\.blocks\.0\.attn\.proj'"
    )


def test_pixtral_heads_become_local(mesh2):
    """PixtralAttention views q/k/v with its `num_heads` (4 in the tiny tower): 2 per rank at tp=2."""
    model = dtp.parallelize(tiny_vision_model(MISTRAL3), mesh2["tp"])
    attn = model.model.vision_tower.transformer.layers[0].attention
    assert (attn.num_heads, attn.head_dim) == (2, 8)
    assert attn.q_proj.weight.to_local().shape == (16, 32)


def test_full_size_qwen2_5_vl_vision_tower_splits_up_to_tp4():
    """16 heads, widths 1280 and 5120, but SwiGLU intermediate 3420 = 4 x 855: tp in {1, 2, 4} without pad."""
    assert dtp.tp_candidates(meta_vision_model(QWEN_VL, QWEN_VL_7B_VISION)) == [1, 2, 4]


@pytest.mark.parametrize(
    ("cls", "vision", "whole_bytes"),
    [
        (QWEN_VL, QWEN_VL_7B_VISION, 1_353_100_288),
        (MISTRAL3, PIXTRAL_SMALL_3_1, 815_069_184),
        (GEMMA3, GEMMA3_12B["vision_config"], 833_808_096),
        (QWEN3_VL, QWEN3_VL_4B["vision_config"], 830_695_424),
    ],
)
@pytest.mark.parametrize(("mesh", "bound"), [("mesh2", 0.51), ("mesh4", 0.261)])
def test_full_size_vision_tower_per_rank_bytes(request, cls, vision, whole_bytes, mesh, bound):
    """Released vision towers (bf16; Mistral 3's and Gemma 3's with a projector to the tiny language model's width):
    a rank holds 0.5012 / 0.2519 of Qwen2.5-VL-7B's at tp=2 / 4, 0.5059 / 0.2589 of Mistral-Small-3.1's, 0.5067 /
    0.2601 of gemma-3-12b's SigLIP, 0.5050 / 0.2574 of Qwen3-VL-4B's (measured; the rest is the replicated patch
    embeddings, position tables, norms, rowwise biases, Mistral 3's patch merger)."""
    model = meta_vision_model(cls, vision)
    assert vision_bytes(model) == whole_bytes
    tp_mesh = request.getfixturevalue(mesh)
    dtp.parallelize(model, tp_mesh["tp"] if tp_mesh.ndim > 1 else tp_mesh)
    assert vision_bytes(model) / whole_bytes <= bound
