"""The issue-26 plans: each passed every static check before, then crashed or (the first) ran silently wrong.

Each must now be refused by `prepare` with a PlanError naming its key, the model untouched; the
bundled plans they are mutated from still pass (the positive control).
"""

from dataclasses import replace

import pytest

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.resolve import resolve
from dtp.resolve.exactness.alignment import check_alignment
from dtp.resolve.transforms.kv_share import share_kv
from dtp.resolve.transforms.padding import pad_resolved
from dtp.testing import fuzz
from dtp.testing.fuzz import snapshot, unchanged
from dtp.testing.plans import edited
from dtp.testing.tiny import tiny_model
from dtp.testing.tiny_text import tiny_grouped_qwen

FLUX, QWEN = "FluxTransformer2DModel", "QwenImageTransformer2DModel"


@pytest.fixture
def mesh2():  # per test (a fake group costs milliseconds): tests at tp=4 need a world of 4
    with fake_world(2):
        yield dtp.make_mesh(tp=2, device_type="cpu")


@pytest.fixture
def mesh4():
    with fake_world(4):
        yield dtp.make_mesh(tp=4, device_type="cpu")


def refused(model, mesh, plan, match, pad=False):
    before = snapshot(model)
    with pytest.raises(dtp.PlanError, match=match):
        dtp.parallelize(model, mesh, plan, pad=pad)
    assert unchanged(model, before)


def test_q_packed_blocks_silently_wrong(mesh2):
    """Qwen-Image, to_q packed [1, 3]: runs, off by 2.4e-2 without the alignment rule; refused."""
    plan = edited(
        dtp.load_plan("qwenimage"), {"transformer_blocks.*.attn.to_q": {"style": "packed_colwise", "blocks": [1, 3]}}
    )
    refused(tiny_model(QWEN), mesh2, plan, r"key 'transformer_blocks\.\*\.attn\.to_q'.*does not give rank 0 its heads")


def test_v_dropped(mesh2):
    """FLUX.1, single-stream to_v dropped: q, k sharded, v whole."""
    plan = edited(dtp.load_plan("flux"), {"single_transformer_blocks.*.attn.to_v": None})
    refused(tiny_model(FLUX), mesh2, plan, r"key 'single_transformer_blocks\.\*\.attn\.to_v'.*not in the plan")


def test_rowwise_consumer_dropped(mesh2):
    """FLUX.1, ff_context.net.2 dropped: the colwise net.0.proj has no rowwise consumer in its block."""
    plan = edited(dtp.load_plan("flux"), {"transformer_blocks.*.ff_context.net.2": None})
    refused(
        tiny_model(FLUX),
        mesh2,
        plan,
        r"key 'transformer_blocks\.\*\.ff_context\.net\.0\.proj'.*'transformer_blocks\.\*\.ff_context\.net\.2' is not "
        r"in the plan",
    )


def test_colwise_added_on_an_embedder(mesh2):
    """FLUX.1 with guidance: guidance_embedder.linear_1 colwise feeds the replicated linear_2."""
    key = "time_text_embed.guidance_embedder.linear_1"
    plan = edited(dtp.load_plan("flux"), {key: "colwise"})
    refused(tiny_model(FLUX, guidance_embeds=True), mesh2, plan, rf"key '{key}'.*fails in")


def test_rowwise_k(mesh2):
    """FLUX.1, single-stream to_k rowwise: its input is whole, its output all-reduced whole; q is sharded."""
    key = "single_transformer_blocks.*.attn.to_k"
    plan = edited(dtp.load_plan("flux"), {key: "rowwise"})
    refused(tiny_model(FLUX), mesh2, plan, rf"key '{key}'.*'rowwise'.*does not give rank 0 its heads")


def test_gathered_q(mesh2):
    """FLUX.1, to_q colwise_gathered: q whole, k and v sharded."""
    key = "transformer_blocks.*.attn.to_q"
    plan = edited(dtp.load_plan("flux"), {key: "colwise_gathered"})
    refused(tiny_model(FLUX), mesh2, plan, r"key 'transformer_blocks\.\*\.attn\.to_q'.*'colwise_gathered'")


@pytest.mark.parametrize("name, class_name", [("flux", FLUX), ("qwenimage", QWEN)])
def test_bundled_plans_pass(mesh2, name, class_name):
    """The plans the six are mutated from pass `prepare` (and `dtp.parallelize` shards them)."""
    model = tiny_model(class_name, guidance_embeds=True) if class_name == FLUX else tiny_model(class_name)
    prepared = dtp.engine.prepare(model, mesh2, dtp.load_plan(name))
    assert prepared.resolved.linears, name  # accepted, and something is sharded


def test_declared_blocks(mesh2):
    """FLUX.2's to_qkv_mlp_proj declares [q, k, v, gate, up] = [64, 64, 64, 192, 192]; [192, 192, 64, 64, 64]
    passes the pair rule (to_out's blocks are [64, 192]) but is not where its forward splits: refused."""
    key = "single_transformer_blocks.*.attn.to_qkv_mlp_proj"
    plan = edited(dtp.load_plan("flux2"), {key: {"style": "packed_colwise", "blocks": [192, 192, 64, 64, 64]}})
    model = tiny_model("Flux2Transformer2DModel")
    with pytest.raises(dtp.PlanError, match=rf"key '{key}'.*declares blocks"):
        dtp.engine.prepare(model, mesh2, plan)


def test_alignment_with_shared_kv_and_padding():
    """Qwen2.5-VL in small (6 q / 2 kv heads) at tp=4, pad=True: each kv head on 2 ranks, each group of 3 q heads
    padded to 4. The bound plan aligns; the same plan with q not grouped by kv head (plain contiguous padding,
    rank 1 then holds q heads of both groups next to kv head 0) is refused."""
    model = tiny_grouped_qwen()
    resolved = resolve(dtp.load_plan("qwen2_5_vl"), model)
    bound = share_kv(pad_resolved(resolved, model, 4).resolved, model, 4)
    check_alignment(bound, model, 4)
    ungrouped = tuple(replace(s, groups=1) if s.path.endswith("q_proj") else s for s in bound.linears)
    with pytest.raises(dtp.PlanError, match=r"self_attn\.q_proj.*does not give rank 1 its heads"):
        check_alignment(replace(bound, linears=ungrouped), model, 4)


# Mutants that crashed in the forward (benchmarks/results/plan_fuzz.md, round 3) because these four classes could not
# run on plain meta tensors, so the flow check skipped them: (class, plan, edits, pad, what the PlanError says).
DATA_DEPENDENT = [
    (
        "HiDreamImageTransformer2DModel",  # bincount of the MoE routing
        "hidream",
        {"double_stream_blocks.*.block.ff_t.w3": None},
        False,
        r"key 'double_stream_blocks\.\*\.block\.ff_t\.w1'.*fails in 'double_stream_blocks\.0\.block\.ff_t'",
    ),
    (
        "HiDreamImageTransformer2DModel",  # an expert the routing may never pick in the example: every expert runs
        "hidream",
        {"single_stream_blocks.*.block.ff_i.experts.0.w3": "colwise_gathered"},
        True,
        r"key 'single_stream_blocks\.\*\.block\.ff_i\.experts\.0\.w1'.*fails in",
    ),
    (
        "Lumina2Transformer2DModel",  # attention_mask.sum(dim=1).tolist()
        "lumina2",
        {"norm_out.linear_1": "rowwise", "x_embedder": "colwise"},
        True,
        r"key 'x_embedder': at tp=2 the sharded forward fails in 'noise_refiner\.0",  # the unconsumed colwise shard
    ),
    (
        "MochiTransformer3DModel",  # torch.autocast("meta")
        "mochi",
        {"rope": None},
        False,
        r"at tp=2 the sharded forward fails in 'transformer_blocks\.0\.attn1'",
    ),
    (
        "QwenImage21Transformer2DModel",  # repeat_interleave, nonzero and tolist of the image-token mask
        "qwenimage21",
        {"transformer_blocks.*.img_mlp.proj": None},
        True,
        r"key 'transformer_blocks\.\*\.img_mlp\.gate_layer'.*fails in 'transformer_blocks\.0\.img_mlp'",
    ),
]


@pytest.mark.parametrize("class_name, name, changes, pad, match", DATA_DEPENDENT, ids=lambda v: str(v)[:40])
def test_data_dependent_forwards_are_checked(mesh2, class_name, name, changes, pad, match):
    """Each crashed at tp=2 before (the flow check skipped the class); refused now, the model untouched."""
    refused(tiny_model(class_name), mesh2, fuzz.edited(name, changes, 2, pad).plan(), match, pad=pad)


@pytest.mark.parametrize("class_name, name", sorted({(c, n) for c, n, *_ in DATA_DEPENDENT}))
def test_data_dependent_bundled_plans_pass(mesh2, class_name, name):
    """The positive control: their bundled plans pass the flow check (run with known values), with and without pad."""
    for pad in (False, True):
        prepared = dtp.engine.prepare(tiny_model(class_name), mesh2, dtp.load_plan(name), pad=pad)
        assert prepared.resolved.linears, (name, pad)  # accepted, and something is sharded


def test_rope_cut_to_heads_reaching_whole_attention(mesh4):
    """The plan fuzz's wrong mutant (benchmarks/results/plan_fuzz.md, round 4): Mochi tp=4, attn1's attention glob
    and every attn1 rule dropped, `rope` still cut to each rank's heads. At tp = heads the cut table
    [S, 1, head_dim / 2] broadcasts over attn1's 4 whole heads: it ran, 1.9e-2 from one process. Refused now,
    naming the table's key and the attention it reaches; the bundled plan (rope with attn1 sharded) passes."""
    attn1 = [r.key for r in dtp.load_plan("mochi").rules if r.key.startswith("transformer_blocks.*.attn1.")]
    mutant = replace(fuzz.edited("mochi", dict.fromkeys(attn1), 4), attention=())
    model = tiny_model("MochiTransformer3DModel")
    match = r"key 'rope'.*reaches attention 'transformer_blocks\.0\.attn1'.*Add 'transformer_blocks\.\*\.attn1'"
    refused(model, mesh4, mutant.plan(), match)
    assert dtp.engine.prepare(model, mesh4, dtp.load_plan("mochi")).resolved.outputs


def test_sharded_activation_written_into_a_whole_sequence(mesh4):
    """The plan fuzz's crash: Qwen-Image 2.1 tp=4 pad=True with `img_in: colwise`. Its forward writes img_in's
    output into the joint sequence (`joint[:, image_pad_mask] = hidden_states`), whose meta kernel checks no
    shapes: accepted, then a shape mismatch in the real forward. Refused now, naming img_in."""
    mutant = fuzz.edited("qwenimage21", {"img_in": "colwise"}, 4, pad=True)
    match = r"key 'img_in'.*shape mismatch: value tensor of shape .* cannot be broadcast.*'img_in' \(colwise\)"
    refused(tiny_model("QwenImage21Transformer2DModel"), mesh4, mutant.plan(), match, pad=True)
