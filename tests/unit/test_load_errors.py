"""dtp.from_pretrained refuses bad checkpoints with a clear error before reading a tensor byte.

Runs on the fake process group (rank 0 of 4, tp=4): loading issues no collective, so rank 0's
whole load runs in this process. "Before any parameter was replaced" is checked by counting
calls of the loader's read step, which is where parameters are replaced.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import dtp
import dtp.loading.load
from dtp.loading.checkpoint import INDEX_NAME, WEIGHTS_NAME, CheckpointError, open_checkpoint
from dtp.testing.tiny import tiny_model

FLUX = "FluxTransformer2DModel"


@pytest.fixture(scope="module")
def mesh(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A good single-file tiny Flux checkpoint; tests copy and damage it."""
    path = tmp_path_factory.mktemp("good")
    tiny_model(FLUX).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture
def reads(monkeypatch):
    """Counts calls of the read step (the first thing that touches tensor data or the model's parameters)."""
    calls = []
    original = dtp.loading.load._read_into
    monkeypatch.setattr(dtp.loading.load, "_read_into", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def _copy(saved, tmp_path, state=None):
    """`saved`'s config with `state` (default: its own tensors) as the single weights file."""
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    save_file(state if state is not None else load_file(saved / WEIGHTS_NAME), tmp_path / WEIGHTS_NAME)
    return tmp_path


def _load(path, mesh):
    return dtp.from_pretrained(dtp.testing.tiny.model_class(FLUX), str(path), mesh)


def test_good_checkpoint_loads(saved, mesh, reads):
    """Control: the undamaged checkpoint loads (so the failures below are caused by the damage)."""
    model = _load(saved, mesh)
    assert reads == [1]
    assert model.transformer_blocks[0].attn.heads == 1  # 4 heads / tp 4


def test_missing_keys_are_listed(saved, mesh, reads, tmp_path):
    state = load_file(saved / WEIGHTS_NAME)
    dropped = ["transformer_blocks.0.attn.to_q.weight", "proj_out.bias"]
    path = _copy(saved, tmp_path, {k: v for k, v in state.items() if k not in dropped})
    with pytest.raises(CheckpointError, match="lacks 2 of FluxTransformer2DModel") as error:
        _load(path, mesh)
    assert all(k in str(error.value) for k in dropped)
    assert reads == []


def test_unexpected_keys(saved, mesh, reads, tmp_path):
    state = load_file(saved / WEIGHTS_NAME) | {"extra.weight": torch.zeros(2)}
    with pytest.raises(CheckpointError, match="1 tensors FluxTransformer2DModel does not: 'extra.weight'"):
        _load(_copy(saved, tmp_path, state), mesh)
    assert reads == []


def test_shape_mismatch_names_both_shapes(saved, mesh, reads, tmp_path):
    state = load_file(saved / WEIGHTS_NAME)
    state["transformer_blocks.1.ff.net.2.weight"] = torch.zeros(64, 128)
    expected = r"'transformer_blocks.1.ff.net.2.weight': checkpoint shape \[64, 128\] != model shape \[64, 256\]"
    with pytest.raises(CheckpointError, match=expected):
        _load(_copy(saved, tmp_path, state), mesh)
    assert reads == []


def test_non_safetensors_weights(saved, mesh, reads, tmp_path):
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    torch.save(load_file(saved / WEIGHTS_NAME), tmp_path / "diffusion_pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"non-safetensors weights \(diffusion_pytorch_model.bin\)"):
        _load(tmp_path, mesh)
    assert reads == []


def test_truncated_file(saved, mesh, reads, tmp_path):
    path = _copy(saved, tmp_path)
    size = os.path.getsize(path / WEIGHTS_NAME)
    os.truncate(path / WEIGHTS_NAME, size - 100)
    with pytest.raises(CheckpointError, match=f"is truncated: tensor '.+' ends at byte {size} but the file has only"):
        _load(path, mesh)
    assert reads == []


def test_corrupt_header(saved, mesh, reads, tmp_path):
    path = _copy(saved, tmp_path)
    with open(path / WEIGHTS_NAME, "r+b") as f:
        f.seek(8)
        f.write(b"\xff\x00garbage")
    with pytest.raises(CheckpointError, match="is corrupt: its header is not valid JSON"):
        _load(path, mesh)
    assert reads == []


def test_index_naming_a_missing_shard(saved, mesh, reads, tmp_path):
    tiny_model(FLUX).save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    weight_map = json.loads((tmp_path / INDEX_NAME).read_text())["weight_map"]
    victim = sorted(set(weight_map.values()))[1]
    os.remove(tmp_path / victim)
    with pytest.raises(CheckpointError, match=f"names shard '{victim}'.+but the file is missing"):
        _load(tmp_path, mesh)
    assert reads == []


def test_plan_error_comes_before_the_checkpoint(mesh, reads, tmp_path):
    """tp=4 does not divide 2 heads: PlanError even though the weights file is garbage (it is never opened)."""
    tiny_model(FLUX, num_attention_heads=2, attention_head_dim=32).save_pretrained(tmp_path)
    (tmp_path / WEIGHTS_NAME).write_bytes(b"not a safetensors file")
    with pytest.raises(dtp.PlanError, match="tp=4 does not divide heads of transformer_blocks.0.attn=2") as error:
        _load(tmp_path, mesh)
    assert not isinstance(error.value, CheckpointError)
    assert reads == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 0.999))
def test_any_truncation_is_a_checkpoint_error(saved, tmp_path_factory, cut):
    """Cutting a safetensors file anywhere gives CheckpointError from the headers alone, never another exception."""
    data = (saved / WEIGHTS_NAME).read_bytes()
    path = tmp_path_factory.mktemp("cut")
    (path / WEIGHTS_NAME).write_bytes(data[: int(cut * len(data))])
    with pytest.raises(CheckpointError):
        open_checkpoint(str(path))


def test_header_offsets_that_disagree_with_the_shape(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}).encode()
    (tmp_path / WEIGHTS_NAME).write_bytes(struct.pack("<Q", len(header)) + header + bytes(24))
    with pytest.raises(CheckpointError, match=r"needs 24 bytes but its offsets \[0, 20\) span 20"):
        open_checkpoint(str(tmp_path))


def test_device_of_another_type_than_the_mesh(saved, mesh, reads):
    with pytest.raises(dtp.PlanError, match="device cuda:0 does not match the mesh's device type 'cpu'"):
        dtp.from_pretrained(dtp.testing.tiny.model_class(FLUX), str(saved), mesh, device="cuda:0")
    assert reads == []


def test_subfolder_and_the_bytes_log_line(saved, mesh, tmp_path, caplog):
    """`subfolder=` is honoured, and each rank logs the bytes it read (here rank 0 of tp=4)."""
    (tmp_path / "transformer").mkdir()
    _copy(saved, tmp_path / "transformer")
    with caplog.at_level("INFO", logger="dtp.loading.load"):
        dtp.from_pretrained(dtp.testing.tiny.model_class(FLUX), str(tmp_path), mesh, subfolder="transformer")
    total = sum(info.nbytes for info in open_checkpoint(str(saved)).tensors.values())
    assert any("rank 0: read " in r.message and f" of {total} checkpoint bytes" in r.message for r in caplog.records)


def test_missing_config(saved, mesh, reads, tmp_path):
    (tmp_path / WEIGHTS_NAME).write_bytes((saved / WEIGHTS_NAME).read_bytes())
    with pytest.raises(CheckpointError, match="has no config.json; pass the model folder"):
        _load(tmp_path, mesh)
    assert reads == []
