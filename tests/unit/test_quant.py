"""Quantized weights: what dtp recognizes, and what `prepare` refuses before anything is mutated.

Runs on torch's fake process group (tp=4, rank 0): the checks read shapes and scale layouts only.
Parity on real collectives is in tests/distributed/test_quant_parity_*.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from torchao.quantization import (  # noqa: E402
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    PerGroup,
    PerTensor,
    quantize_,
)

import dtp  # noqa: E402
from dtp.quant import LAYOUT_ATTR, describe, shard_weight  # noqa: E402
from dtp.resolve import Layout  # noqa: E402
from dtp.testing.quant import quantize  # noqa: E402
from dtp.testing.tiny import tiny_model  # noqa: E402

FLUX = "FluxTransformer2DModel"


@pytest.fixture(scope="module")
def mesh(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


def _linear(out_features=32, in_features=64, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features)


@pytest.mark.parametrize(
    "scheme, expected",
    [("int8wo", ("int8wo", "per_row")), ("fp8wo", ("fp8wo", "per_row")), ("fp8", ("fp8", "per_row"))],
)
def test_describe_schemes(scheme, expected):
    linear = quantize(torch.nn.Sequential(_linear()), scheme)[0]
    kind = describe(linear.weight)
    assert (kind.scheme, kind.granularity) == expected and kind.supported


def test_describe_plain_and_refused():
    assert describe(torch.zeros(3, 4)) is None
    assert describe(torch.zeros(3, 4, dtype=torch.float8_e4m3fn)) is None  # layerwise casting: a plain tensor
    grouped = _linear()
    quantize_(grouped, Int8WeightOnlyConfig(granularity=PerGroup(16)))
    kind = describe(grouped.weight)
    assert not kind.supported and "blocks" in kind.granularity, kind
    per_tensor = _linear()
    quantize_(per_tensor, Int8WeightOnlyConfig(granularity=PerTensor()))
    assert describe(per_tensor.weight).granularity == "per_tensor"


def _local_pieces(weight, layout, mesh):
    sharded = shard_weight(weight, layout, mesh)
    return sharded.qdata.to_local(), sharded.scale.to_local()


def test_colwise_slices_rows_and_their_scales(mesh):
    """Rank 0 of tp=4, colwise packed [16, 16]: rows 0:4 and 16:20, the same rows' scales (chunk per block)."""
    linear = quantize(torch.nn.Sequential(_linear()), "int8wo")[0]
    qdata, scale = _local_pieces(linear.weight, Layout(0, (16, 16)), mesh["tp"])
    w = linear.weight
    assert torch.equal(qdata, torch.cat([w.qdata[:16].chunk(4)[0], w.qdata[16:].chunk(4)[0]]))
    assert torch.equal(scale, torch.cat([w.scale[:16].chunk(4)[0], w.scale[16:].chunk(4)[0]]))


def test_rowwise_keeps_whole_row_scales(mesh):
    """Rank 0 of tp=4, rowwise: columns 0:16, and every row's scale of the WHOLE row (not of the slice)."""
    linear = quantize(torch.nn.Sequential(_linear()), "fp8wo")[0]
    qdata, scale = _local_pieces(linear.weight, Layout(1, (64,)), mesh["tp"])
    assert torch.equal(qdata.view(torch.uint8), linear.weight.qdata[:, :16].view(torch.uint8))
    assert torch.equal(scale, linear.weight.scale)
    sliced = quantize(torch.nn.Sequential(torch.nn.Linear(16, 32)), "fp8wo")[0]
    with torch.no_grad():
        sliced.weight = torch.nn.Parameter(type(linear.weight).from_hp(_linear().weight[:, :16].detach()), False)
    assert not torch.equal(scale, sliced.weight.scale)  # the slice's own scales differ: the check can fail


def test_padded_rows_get_scale_one(mesh):
    """30 rows in 2 groups of 15, each padded to 32, at tp=4: rank 0 holds rows 0:15 and one padded row
    (qdata 0, scale 1, so fp8's 0 / 0 never happens)."""
    linear = quantize(torch.nn.Sequential(_linear(out_features=30)), "fp8wo")[0]
    qdata, scale = _local_pieces(linear.weight, Layout(0, (30,), (64,), groups=2), mesh["tp"])
    w = linear.weight
    assert torch.equal(qdata[:15].view(torch.uint8), w.qdata[:15].view(torch.uint8))
    assert torch.equal(scale[:15], w.scale[:15])
    assert not qdata[15:].float().any() and torch.equal(scale[15:], torch.ones(1, 1))


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda m: quantize_(m, Int8WeightOnlyConfig(granularity=PerGroup(16))), ["int8wo", "blocks"]),
        (lambda m: quantize_(m, Int8DynamicActivationInt8WeightConfig()), ["scheme int8", "rowwise", "all-reduce"]),
    ],
    ids=["per-group int8", "int8 dynamic on a rowwise layer"],
)
def test_prepare_refuses_before_mutating(mesh, make, words):
    """A PlanError naming the key, the module and the scheme; every weight is as it was."""
    model = tiny_model(FLUX)
    make(model)
    before = {n: (type(p), p.qdata.clone()) for n, p in model.named_parameters() if describe(p) is not None}
    with pytest.raises(dtp.PlanError) as info:
        dtp.parallelize(model, mesh)
    message = str(info.value)
    assert all(word in message for word in words) and "transformer_blocks.0." in message, message
    after = {n: (type(p), p.qdata) for n, p in model.named_parameters() if describe(p) is not None}
    assert before.keys() == after.keys()
    assert all(before[n][0] is after[n][0] and torch.equal(before[n][1], after[n][1]) for n in before)


def test_lora_on_quantized_layers_split_like_the_base(mesh):
    """load_lora onto a sharded model whose Linears are quantized (peft's TorchaoLoraLinear): the adapter is
    sized from the local shape and split like an unquantized base's (parity: test_prequantized_parity.py)."""
    model = dtp.parallelize(quantize(tiny_model(FLUX), "int8wo"), mesh)
    path = "transformer_blocks.0.attn.to_q"  # colwise 64 -> 64: B's rows split, A whole
    lora = {
        f"transformer.{path}.lora_A.weight": torch.zeros(4, 64),
        f"transformer.{path}.lora_B.weight": torch.zeros(64, 4),
    }
    dtp.load_lora(model, lora, adapter_name="a")
    layer = model.get_submodule(path)
    assert type(layer).__name__ == "TorchaoLoraLinear" and describe(layer.base_layer.weight).scheme == "int8wo"
    assert layer.lora_B["a"].weight.to_local().shape == (16, 4) and layer.lora_A["a"].weight.to_local().shape == (4, 64)
    assert (layer.base_layer.in_features, layer.base_layer.out_features) == (64, 64)  # restored after peft
    layout, before = getattr(layer.base_layer.weight, LAYOUT_ATTR), layer.base_layer.weight
    model.fuse_lora()  # peft re-quantizes W + B A s on the DTensor weight; dtp records the layout again
    fused = layer.base_layer.weight
    assert fused is not before and describe(fused).scheme == "int8wo" and getattr(fused, LAYOUT_ATTR) == layout


def test_from_pretrained_refuses_unloadable_configs():
    """A quantization_config dtp cannot apply slice by slice: PlanError naming it, before anything is read."""
    from diffusers import TorchAoConfig

    from dtp.quant.load import torchao_config

    config, skip = torchao_config(TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=["proj_out"]))
    assert type(config).__name__ == "Int8WeightOnlyConfig" and skip == ["proj_out"]
    with pytest.raises(dtp.PlanError, match="Int8DynamicActivationInt8WeightConfig"):
        torchao_config(TorchAoConfig(Int8DynamicActivationInt8WeightConfig()))
    with pytest.raises(dtp.PlanError, match="PerGroup"):
        torchao_config(Int8WeightOnlyConfig(granularity=PerGroup(16)))


def test_rank_agreement_fingerprint_includes_the_quantization(mesh):
    """Ranks quantized differently (none, int8wo, fp8wo) fingerprint differently, and the difference report
    names the schemes; equal quantization gives equal items."""
    from dtp.engine import prepare
    from dtp.runtime.agree import describe as describe_difference
    from dtp.runtime.agree import fingerprint

    def items(scheme):
        model = tiny_model(FLUX) if scheme is None else quantize(tiny_model(FLUX), scheme)
        prepared = prepare(model, mesh, dtp.load_plan("flux"))
        return fingerprint(model, prepared.resolved, prepared.cp_resolved, mesh, {})

    plain, int8, fp8 = items(None), items("int8wo"), items("fp8wo")
    assert items("int8wo") == int8
    assert len({str(plain), str(int8), str(fp8)}) == 3
    message = describe_difference({0: int8, 1: fp8, 2: plain})
    assert "quantized weights is int8wo x" in message and "fp8wo x" in message and "none on ranks [2]" in message


def test_fp8_dynamic_load_refused_where_torchao_cannot_run_it():
    """`--quant fp8` (float8 dynamic activation, per row): a PlanError before a byte is read where torchao would
    stop mid-load with a bare AssertionError (no CUDA capability >= 8.9 here; float32 weights with PerRow)."""
    from dtp.quant import config_for
    from dtp.quant.load import check_runnable, diffusers_config

    config = config_for("fp8")
    assert type(config).__name__ == "Float8DynamicActivationFloat8WeightConfig"
    assert [type(g).__name__ for g in config.granularity] == ["PerRow", "PerRow"]
    if not torch.cuda.is_available():
        with pytest.raises(dtp.PlanError, match="capability >= 8.9"):
            check_runnable(config, torch.bfloat16)
        with pytest.raises(dtp.PlanError, match="capability >= 8.9"):  # the one-process pipeline too
            diffusers_config(config)
    check_runnable(config_for("int8wo"), torch.float32)  # weight-only: runs anywhere


def test_run_quant_flag_is_a_torchao_config():
    """`dtp run --quant SCHEME` parses to `dtp.quant.config_for(SCHEME)`; its choices are every scheme."""
    from dtp.pipeline.session import quant_config
    from dtp.quant import SCHEMES
    from dtp.tools import commands, run

    assert tuple(sorted(SCHEMES)) == commands.RUN_QUANT_SCHEMES
    args = commands.build_parser().parse_args(["run", "--model-dir", "m", "--prompt", "p", "--quant", "int8wo"])
    assert type(quant_config(run.load_options(args))).__name__ == "Int8WeightOnlyConfig"
    plain = commands.build_parser().parse_args(["run", "--model-dir", "m", "--prompt", "p"])
    assert quant_config(run.load_options(plain)) is None


def test_prequantized_checkpoint_whole_load_sharded(mesh, tmp_path):
    """A checkpoint diffusers saved already quantized by torchao (safetensors of `_weight_qdata` / `_weight_scale`
    pieces), loaded whole by diffusers: `dtp.parallelize` shards its Int8Tensor weights. (Shard-on-load of such a
    folder: tests/unit/test_quant_prequantized.py.)"""
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from torch.distributed.tensor import DTensor

    tiny_model(FLUX).save_pretrained(tmp_path / "plain")
    config = TorchAoConfig(Int8WeightOnlyConfig())
    saved = FluxTransformer2DModel.from_pretrained(tmp_path / "plain", quantization_config=config)
    saved.save_pretrained(tmp_path / "quantized")
    model = dtp.parallelize(FluxTransformer2DModel.from_pretrained(tmp_path / "quantized"), mesh)
    weight = model.transformer_blocks[0].attn.to_q.weight
    assert describe(weight).scheme == "int8wo" and isinstance(weight.qdata, DTensor)


def _gguf_q8_0(linear: torch.nn.Linear):
    """`linear`'s weight as diffusers' GGUF loader holds it: Q8_0 blocks (32 values, 34 bytes) as raw bytes."""
    import gguf
    from diffusers.quantizers.gguf.utils import GGUFParameter

    blocks = gguf.quants.quantize(linear.weight.detach().numpy(), gguf.GGMLQuantizationType.Q8_0)
    return GGUFParameter(torch.from_numpy(blocks), quant_type=gguf.GGMLQuantizationType.Q8_0)


def test_gguf_refused_precisely(mesh):
    """GGUF (diffusers' GGUFQuantizationConfig / GGUFParameter): not sharded. parallelize raises a PlanError naming
    the module and the GGUF type before touching the model; from_pretrained's config check names it too."""
    pytest.importorskip("gguf")
    from diffusers import GGUFQuantizationConfig

    from dtp.quant.load import torchao_config

    model = tiny_model(FLUX)
    to_q = model.transformer_blocks[0].attn.to_q
    to_q.weight = _gguf_q8_0(to_q)
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(dtp.PlanError, match=r"transformer_blocks\.0\.attn\.to_q.*gguf Q8_0.*GGUFLinear"):
        dtp.parallelize(model, mesh)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    with pytest.raises(dtp.PlanError, match="GGUFQuantizationConfig.*single file"):
        torchao_config(GGUFQuantizationConfig(compute_dtype=torch.bfloat16))
