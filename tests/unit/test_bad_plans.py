"""Bad plans raise PlanError naming the key, and leave the model exactly as it was."""

import pytest
import torch
from torch.distributed.tensor import DTensor

import dtp
from dtp.resolve.binding.heads import HEAD_ATTRS, WIDTH_ATTRS
from dtp.testing.tiny import tiny_model

FLUX = "FluxTransformer2DModel"
BASE = {"transformer_blocks.*.attn.to_q": "colwise", "transformer_blocks.*.attn.to_out.0": "rowwise"}


def snapshot(model):
    """Every parameter/buffer value and every attention bookkeeping attribute."""
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    attrs = {
        (name, attr): getattr(module, attr)
        for name, module in model.named_modules()
        for attr in HEAD_ATTRS + WIDTH_ATTRS
        if hasattr(module, attr)
    }
    return tensors, attrs


def assert_unchanged(model, before):
    tensors, attrs = before
    after_tensors, after_attrs = snapshot(model)
    assert after_tensors.keys() == tensors.keys()
    for key, value in tensors.items():
        assert not isinstance(after_tensors[key], DTensor), key
        assert torch.equal(after_tensors[key], value), key
    assert after_attrs == attrs


def raises_and_unchanged(model, mesh, plan_dict, match):
    before = snapshot(model)
    with pytest.raises(dtp.PlanError, match=match):
        dtp.parallelize(model, mesh, dtp.Plan.from_dict(plan_dict))
    assert_unchanged(model, before)


@pytest.fixture(scope="module")
def mesh4(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


@pytest.fixture(scope="module")
def mesh2(fake_world):
    return dtp.make_mesh(tp=2, cp=2, device_type="cpu")


def test_two_wildcards(mesh2):
    raises_and_unchanged(
        tiny_model(FLUX),
        mesh2,
        {**BASE, "transformer_blocks.*.attn.*": "colwise"},
        r"key 'transformer_blocks\.\*\.attn\.\*' has 2 wildcards",
    )


def test_glob_over_non_modulelist(mesh2):
    raises_and_unchanged(
        tiny_model(FLUX),
        mesh2,
        {**BASE, "norm_out.*.linear": "colwise"},
        r"key 'norm_out\.\*\.linear'.*nn\.ModuleList.*'norm_out' is a AdaLayerNormContinuous",
    )


def test_missing_path(mesh2):
    raises_and_unchanged(
        tiny_model(FLUX),
        mesh2,
        {**BASE, "transformer_blocks.*.attn.to_qq": "colwise"},
        r"key 'transformer_blocks\.\*\.attn\.to_qq'.*'transformer_blocks\.0\.attn\.to_qq' does not exist",
    )


def test_non_linear_target(mesh2):
    raises_and_unchanged(
        tiny_model(FLUX),
        mesh2,
        {**BASE, "transformer_blocks.*.attn": "colwise"},
        r"key 'transformer_blocks\.\*\.attn'.*FluxAttention, not an nn\.Linear",
    )


def test_unknown_style(mesh2):
    raises_and_unchanged(
        tiny_model(FLUX),
        mesh2,
        {**BASE, "transformer_blocks.*.attn.to_k": "diagonal"},
        r"key 'transformer_blocks\.\*\.attn\.to_k'.*unknown style 'diagonal'",
    )


def test_colwise_without_rowwise_partner(mesh2):
    raises_and_unchanged(
        tiny_model(FLUX),
        mesh2,
        {"transformer_blocks.*.attn.to_q": "colwise"},
        r"key 'transformer_blocks\.\*\.attn\.to_q'.*no rowwise layer",
    )


def test_pair_widths_disagree(mesh2):
    """Flux2's SwiGLU linear_in as plain colwise: width 2h meets a rowwise of width h."""
    model = tiny_model("Flux2Transformer2DModel")
    plan = {"transformer_blocks.*.ff.linear_in": "colwise", "transformer_blocks.*.ff.linear_out": "rowwise"}
    raises_and_unchanged(
        model,
        mesh2,
        plan,
        r"key 'transformer_blocks\.\*\.ff\.linear_out'.*width 192 .*matches no colwise width .*\(\[384\]\)",
    )


def test_tp_not_dividing_heads_tiny_zimage(mesh4):
    """Z-Image with 6 heads at tp=4: every Linear width divides, the head count does not."""
    model = tiny_model("ZImageTransformer2DModel", n_heads=6, n_kv_heads=6, axes_dims=[4, 6, 6])
    before = snapshot(model)
    with pytest.raises(
        dtp.PlanError, match=r"tp=4 does not divide heads of noise_refiner\.0\.attention=6.*Supported tp: 1, 2\."
    ):
        dtp.parallelize(model, mesh4, dtp.load_plan("zimage"))
    assert_unchanged(model, before)


def test_tp4_full_size_zimage_on_meta(mesh4):
    """Z-Image 6B (30 heads, config key `n_heads`): tp=4 is refused from the modules' own head counts."""
    from diffusers import ZImageTransformer2DModel

    with torch.device("meta"):
        model = ZImageTransformer2DModel()
    # gcd(heads 30, dim 3840, ffn 10240) = 10: 5 and 10 are valid too, outside the usual powers of two.
    assert dtp.tp_candidates(model) == [1, 2, 5, 10]
    with pytest.raises(dtp.PlanError, match=r"tp=4 does not divide heads of noise_refiner\.0\.attention=30"):
        dtp.parallelize(model, mesh4)
    assert model.layers[0].attention.heads == 30
    assert not any(isinstance(p, DTensor) for p in model.parameters())


def test_packed_block_not_divisible(mesh4):
    """Flux2 with mlp_hidden 162: the fused blocks' sum (3*64 + 2*162 = 516) divides by 4, blocks of 162 do not."""
    model = tiny_model("Flux2Transformer2DModel", mlp_ratio=162 / 64)
    before = snapshot(model)
    with pytest.raises(
        dtp.PlanError,
        match=r"tp=4 does not divide packed block 0 \(of \[162, 162\]\) of transformer_blocks\.0\.ff\.linear_in=162",
    ):
        dtp.parallelize(model, mesh4, dtp.load_plan("flux2"))
    assert_unchanged(model, before)


@pytest.mark.parametrize(
    "text, match",
    [
        ("tp: [unclosed", "malformed YAML"),
        ("- just\n- a list\n", "must be a mapping with a `tp` mapping"),
        (
            "tp:\n  a.b: {style: packed_colwise, blocks: [1, 0]}\n",
            "blocks must be a non-empty list of positive integers",
        ),
        ("tp:\n  a.b: colwise\nshards: 3\n", r"unknown top-level keys \['shards'\]"),
    ],
)
def test_malformed_yaml(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(dtp.PlanError, match=match):
        dtp.load_plan(path)


def test_world_size_must_equal_cp_times_tp(fake_world):
    with pytest.raises(dtp.PlanError, match=r"world size 4 != cfg \* cp \* tp = 1 \* 1 \* 3"):
        dtp.make_mesh(tp=3, device_type="cpu")
