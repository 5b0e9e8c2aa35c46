"""Checkpoints saved already quantized by torchao: loaded shard-on-load, or refused before a byte is read.

Runs on torch's fake process group (tp=4, rank 0): loading issues no collective, so rank 0's whole load
runs here and its pieces are compared with `dtp.parallelize` of diffusers' one-process load. Parity on
real collectives: tests/distributed/test_prequantized_parity.py.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torchao")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import dtp  # noqa: E402
import dtp.loading.load  # noqa: E402
from dtp.loading.checkpoint import WEIGHTS_NAME, CheckpointError  # noqa: E402
from dtp.quant import config_for, describe  # noqa: E402
from dtp.testing.tiny import model_class, tiny_model  # noqa: E402

FLUX = "FluxTransformer2DModel"
TO_Q = "transformer_blocks.0.attn.to_q"  # colwise
TO_OUT = "transformer_blocks.0.attn.to_out.0"  # rowwise


@pytest.fixture(scope="module")
def mesh(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain")
    tiny_model(FLUX).save_pretrained(path, safe_serialization=True)
    return path


def _saved(plain, path, quant_type, **options):
    """The tiny FLUX.1 checkpoint loaded by diffusers with TorchAoConfig(quant_type) and saved again."""
    from diffusers import TorchAoConfig

    config = TorchAoConfig(quant_type)
    model = model_class(FLUX).from_pretrained(plain, quantization_config=config, torch_dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True, **options)
    return path


@pytest.fixture(scope="module")
def int8wo(plain, tmp_path_factory):
    return _saved(plain, tmp_path_factory.mktemp("int8wo"), config_for("int8wo"))


@pytest.fixture(scope="module")
def int8wo_split(plain, tmp_path_factory):
    """Saved in 20 KB files: 29 files, 6 weights with their qdata and scale in different files."""
    return _saved(plain, tmp_path_factory.mktemp("split"), config_for("int8wo"), max_shard_size="20KB")


@pytest.fixture
def reads(monkeypatch):
    """Counts calls of the read step (the first thing that touches tensor data or the model's parameters)."""
    calls = []
    original = dtp.loading.load._read_into
    monkeypatch.setattr(dtp.loading.load, "_read_into", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def _rewritten(saved, path, edit):
    """A copy of `saved` whose weights file went through `edit(tensors, metadata)` (both dicts, edited in place)."""
    file = saved / WEIGHTS_NAME
    tensors = load_file(file)
    with safe_open(file, framework="pt") as handle:
        metadata = dict(handle.metadata())
    edit(tensors, metadata)
    path.mkdir()
    (path / "config.json").write_text((saved / "config.json").read_text())
    save_file(tensors, path / WEIGHTS_NAME, metadata=metadata)
    return path


def test_rank_pieces_equal_parallelized_whole_load(int8wo_split, mesh):
    """Rank 0 of tp=4 reads the pieces of its colwise rows and rowwise columns (scales whole): the same local
    qdata and scales as `dtp.parallelize` of diffusers' whole load of the folder, bit for bit, for every
    quantized Linear, also those whose pieces lie in different files."""
    loaded = dtp.from_pretrained(model_class(FLUX), str(int8wo_split), mesh, torch_dtype=torch.float32)
    whole = dtp.parallelize(model_class(FLUX).from_pretrained(int8wo_split, torch_dtype=torch.float32), mesh)
    paths = [p for p, m in whole.named_modules() if isinstance(m, torch.nn.Linear) and describe(m.weight) is not None]
    assert len(paths) == 48
    for path in paths:
        ours, theirs = loaded.get_submodule(path).weight, whole.get_submodule(path).weight
        assert type(ours) is type(theirs) and describe(ours).scheme == "int8wo"
        assert type(ours.qdata) is type(theirs.qdata) and getattr(ours.qdata, "placements", 0) == getattr(
            theirs.qdata, "placements", 0
        )
        for piece in ("qdata", "scale", "zero_point"):
            local = [getattr(w, piece) for w in (ours, theirs)]
            local = [t.to_local() if isinstance(t, DTensor) else t for t in local]
            assert torch.equal(*local), (path, piece)
        assert ours.block_size == theirs.block_size
    assert loaded.get_submodule(TO_Q).weight.qdata.to_local().shape == (16, 64)  # 64 rows / 4
    assert loaded.get_submodule(TO_OUT).weight.scale.to_local().shape == (64, 1)  # a row's scale: whole


def test_files_precheck_accepts_it(int8wo_split):
    """`dtp run` without torchrun checks the files before diffusers loads them (`precheck.check_files`): a folder
    saved quantized passes (its pieces count as the model's weights)."""
    from dtp.loading.precheck import check_files

    assert check_files(model_class(FLUX), str(int8wo_split)) is None


def test_other_torchao_class_refused_before_reading(int8wo, tmp_path, mesh, reads):
    """A weight saved as a torchao class dtp does not slice (here Int4Tensor): CheckpointError naming the
    parameter, the class and the fix, before any tensor is read."""

    def edit(tensors, metadata):
        entry = json.loads(metadata[f"{TO_Q}.weight"])
        metadata[f"{TO_Q}.weight"] = json.dumps(entry | {"_type": "Int4Tensor"})

    path = _rewritten(int8wo, tmp_path / "int4", edit)
    with pytest.raises(CheckpointError, match=rf"'{TO_Q}\.weight' was saved as torchao Int4Tensor.*TorchAoConfig"):
        dtp.from_pretrained(model_class(FLUX), str(path), mesh)
    assert not reads


def test_missing_piece_refused(int8wo, tmp_path, mesh, reads):
    """Metadata naming a piece the file lacks: CheckpointError naming the missing key, before any read."""
    path = _rewritten(int8wo, tmp_path / "cut", lambda tensors, _: tensors.pop(f"{TO_OUT}._weight_scale"))
    with pytest.raises(CheckpointError, match=rf"lacks its stored pieces \['{TO_OUT}\._weight_scale'\]"):
        dtp.from_pretrained(model_class(FLUX), str(path), mesh)
    assert not reads


def test_group_scales_refused_in_prepare(plain, tmp_path, mesh, reads):
    """Per-group int8 scales (block [1, 16]) on a sharded Linear: prepare's PlanError names the key, the module,
    the scheme and the granularity, as for a model quantized in memory; nothing is read."""
    from torchao.quantization import Int8WeightOnlyConfig, PerGroup

    path = _saved(plain, tmp_path / "group", Int8WeightOnlyConfig(granularity=PerGroup(16)))
    with pytest.raises(dtp.PlanError, match=r"dtp cannot shard exactly: scheme int8wo.*blocks"):
        dtp.from_pretrained(model_class(FLUX), str(path), mesh)
    assert not reads


def test_second_quantization_refused(int8wo, mesh, reads):
    """quantization_config on a checkpoint saved quantized: PlanError (it would quantize twice), before a read."""
    with pytest.raises(dtp.PlanError, match=r"saved already quantized .*torchao Int8Tensor.*drop quantization_config"):
        dtp.from_pretrained(model_class(FLUX), str(int8wo), mesh, quantization_config=config_for("fp8wo"))
    assert not reads


def test_other_quantizer_refused(plain, tmp_path, mesh, reads):
    """A checkpoint saved quantized by another method (bitsandbytes here): CheckpointError naming it."""
    config = json.loads((plain / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(load_file(plain / WEIGHTS_NAME), tmp_path / WEIGHTS_NAME)
    with pytest.raises(CheckpointError, match=r"saved already quantized \(bitsandbytes\).*torchao"):
        dtp.from_pretrained(model_class(FLUX), str(tmp_path), mesh)
    assert not reads


def test_float8_dynamic_needs_a_gpu(plain, tmp_path, mesh, reads):
    """A Float8Tensor saved with float8 dynamic activation (act_quant_kwargs) on a machine without torchao's float8
    matmul (this CPU): PlanError naming the parameter and the alternatives, before any read."""
    from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
    from torchao.quantization import PerRow
    from torchao.quantization.quantize_.workflows import QuantizeTensorToFloat8Kwargs

    kwargs = json.loads(
        json.dumps(QuantizeTensorToFloat8Kwargs(granularity=PerRow()), cls=TensorSubclassAttributeJSONEncoder)
    )

    def edit(tensors, metadata):
        entry = json.loads(metadata[f"{TO_OUT}.weight"])
        entry["_data"]["act_quant_kwargs"] = kwargs
        metadata[f"{TO_OUT}.weight"] = json.dumps(entry)

    fp8wo = _saved(plain, tmp_path / "fp8wo", config_for("fp8wo"))
    path = _rewritten(fp8wo, tmp_path / "fp8", edit)
    with pytest.raises(
        dtp.PlanError, match=rf"'{TO_OUT}\.weight' was saved as torchao Float8Tensor .*Float8WeightOnly"
    ):
        dtp.from_pretrained(model_class(FLUX), str(path), mesh)
    assert not reads
