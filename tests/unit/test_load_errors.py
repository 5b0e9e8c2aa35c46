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


# ---- transformers text encoders (model.safetensors, transformers' key names and ties) -----------------

T5, QWEN_VL, CLIP = "T5EncoderModel", "Qwen2_5_VLForConditionalGeneration", "CLIPTextModel"
TEXT_WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def text_saved(tmp_path_factory):
    """Good tiny checkpoints as transformers saves them: T5 stores `shared.weight` only (its tie), Qwen2.5-VL
    the old layout (`model.layers.*`, renamed to `model.language_model.layers.*` on load)."""
    from dtp.testing.tiny_text import tiny_text_model

    dirs = {}
    for cls in (T5, QWEN_VL, CLIP):
        dirs[cls] = tmp_path_factory.mktemp(cls)
        tiny_text_model(cls).save_pretrained(dirs[cls])
    return dirs


@pytest.fixture(scope="module")
def mesh2(fake_world):
    """(cp=2, tp=2): a text encoder runs on the tp axis (the tiny GQA encoders have 2 kv heads)."""
    return dtp.make_mesh(tp=2, cp=2, device_type="cpu")


def _text_copy(saved, tmp_path, edit):
    """`saved`'s config with its weights after `edit(state) -> state`."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    save_file(edit(load_file(saved / TEXT_WEIGHTS)), tmp_path / TEXT_WEIGHTS)
    return tmp_path


def _load_text(cls, path, mesh):
    import transformers

    return dtp.from_pretrained(getattr(transformers, cls), str(path), mesh)


def test_text_encoder_good_checkpoints_load(text_saved, mesh, mesh2, reads):
    """Control: T5 (tie stored once) at tp=4 and Qwen2.5-VL (renamed keys) at tp=2 load; the tie holds."""
    t5 = _load_text(T5, text_saved[T5], mesh)
    assert t5.shared.weight is t5.encoder.embed_tokens.weight
    assert t5.shared.weight.to_local().shape == (16, 32)  # 64 rows / tp 4
    qwen = _load_text(QWEN_VL, text_saved[QWEN_VL], mesh2)
    assert qwen.model.language_model.layers[0].mlp.up_proj.weight.to_local().shape == (32, 32)  # 64 / tp 2
    assert reads == [1, 1]


def test_shared_kv_heads_load_their_group_once(text_saved, mesh):
    """Qwen2.5-VL (4 query / 2 kv heads) at tp=4, rank 0: q rows 0:8 (head 0), k/v rows 0:16 (kv head 0, which
    rank 1 reads too); the rank reads exactly its share, the shared k/v bytes counted twice over the ranks."""
    import transformers

    from dtp.loading.load import load

    model, stats = load(transformers.Qwen2_5_VLForConditionalGeneration, str(text_saved[QWEN_VL]), mesh)
    reference = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(text_saved[QWEN_VL])
    attn, ref = model.model.language_model.layers[0].self_attn, reference.model.language_model.layers[0].self_attn
    assert torch.equal(attn.k_proj.weight.to_local(), ref.k_proj.weight[:8])  # head_dim 8: kv head 0
    assert torch.equal(attn.q_proj.weight.to_local(), ref.q_proj.weight[:8])
    assert (attn.num_heads, attn.num_key_value_heads, attn.num_key_value_groups) == (1, 1, 1)
    assert stats.shared_bytes > 0 and stats.bytes_read == stats.share_bytes


def test_text_encoder_old_clip_layout(text_saved, mesh, reads, tmp_path):
    """CLIP as transformers 4 saved it (FLUX.1's text_encoder): `text_model.` prefix, persistent `position_ids`.
    transformers' mapping drops the prefix and ignores position_ids; rank 0 holds rows 0-15 of the vocab."""
    import transformers

    def old(state):
        position_ids = {"text_model.embeddings.position_ids": torch.arange(16)[None]}
        return {f"text_model.{k}": v for k, v in state.items()} | position_ids

    model = _load_text(CLIP, _text_copy(text_saved[CLIP], tmp_path, old), mesh)
    reference = transformers.CLIPTextModel.from_pretrained(text_saved[CLIP])
    local = model.embeddings.token_embedding.weight.to_local()
    assert torch.equal(local, reference.embeddings.token_embedding.weight[:16])
    assert reads == [1]


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_text_encoder_dtypes_are_transformers(text_saved, mesh, dtype):
    """Every parameter's and buffer's dtype is the one T5EncoderModel.from_pretrained gives (None: its "auto";
    float16: T5's `_keep_in_fp32_modules` `wo` stays float32), and so is the attention implementation."""
    import transformers

    model = dtp.from_pretrained(transformers.T5EncoderModel, str(text_saved[T5]), mesh, torch_dtype=dtype)
    reference = transformers.T5EncoderModel.from_pretrained(text_saved[T5], dtype=dtype or "auto")
    found = {n: t.dtype for n, t in [*model.named_parameters(), *model.named_buffers()]}
    assert found == {n: t.dtype for n, t in [*reference.named_parameters(), *reference.named_buffers()]}
    assert model.config._attn_implementation == reference.config._attn_implementation
    if dtype == torch.float16:
        assert found["encoder.block.0.layer.1.DenseReluDense.wo.weight"] == torch.float32


def test_text_encoder_auto_dtype_from_the_weights(text_saved, mesh, tmp_path):
    """A config without a dtype: transformers' "auto" takes the weights' (float16 here), so does dtp."""
    import transformers

    path = _text_copy(text_saved[T5], tmp_path, lambda s: {k: v.half() for k, v in s.items()})
    config = {k: v for k, v in json.loads((path / "config.json").read_text()).items() if k != "dtype"}
    (path / "config.json").write_text(json.dumps(config))
    model = _load_text(T5, path, mesh)
    reference = transformers.T5EncoderModel.from_pretrained(path)
    assert model.shared.weight.dtype == reference.shared.weight.dtype == torch.float16


def test_text_encoder_missing_key(text_saved, mesh, reads, tmp_path):
    dropped = "encoder.block.1.layer.0.SelfAttention.q.weight"
    path = _text_copy(text_saved[T5], tmp_path, lambda s: {k: v for k, v in s.items() if k != dropped})
    with pytest.raises(CheckpointError, match=f"lacks 1 of T5EncoderModel's tensors: '{dropped}'"):
        _load_text(T5, path, mesh)
    assert reads == []


def test_text_encoder_tie_with_no_member_stored(text_saved, mesh, reads, tmp_path):
    """Neither `shared.weight` nor `encoder.embed_tokens.weight`: both are named missing."""
    path = _text_copy(text_saved[T5], tmp_path, lambda s: {k: v for k, v in s.items() if k != "shared.weight"})
    with pytest.raises(CheckpointError, match="lacks 2 of T5EncoderModel's tensors: 'shared.weight', 'encoder.embed"):
        _load_text(T5, path, mesh)
    assert reads == []


def test_text_encoder_ignored_and_unexpected_keys(text_saved, mesh, reads, tmp_path):
    """T5EncoderModel ignores `decoder` keys (transformers' `_keys_to_ignore_on_load_unexpected`), and reads
    none of them; any other extra key is refused."""
    decoder = {"decoder.block.0.layer.0.SelfAttention.q.weight": torch.zeros(32, 32)}
    _load_text(T5, _text_copy(text_saved[T5], tmp_path / "ok", lambda s: s | decoder), mesh)
    assert reads == [1]
    extra = {"encoder.extra.weight": torch.zeros(2)}
    with pytest.raises(CheckpointError, match="1 tensors T5EncoderModel does not: 'encoder.extra.weight'"):
        _load_text(T5, _text_copy(text_saved[T5], tmp_path / "bad", lambda s: s | extra), mesh)
    assert reads == [1]


def test_text_encoder_renamed_key_with_wrong_shape(text_saved, mesh2, reads, tmp_path):
    """A renamed key is named as stored and as the module calls it."""
    key = "model.layers.1.mlp.down_proj.weight"
    path = _text_copy(text_saved[QWEN_VL], tmp_path, lambda s: s | {key: torch.zeros(32, 32)})
    expected = (
        rf"tensor '{key}' \(-> 'model.language_model.layers.1.mlp.down_proj.weight'\): "
        r"checkpoint shape \[32, 32\] != model shape \[32, 64\]"
    )
    with pytest.raises(CheckpointError, match=expected):
        _load_text(QWEN_VL, path, mesh2)
    assert reads == []


def test_text_encoder_renamed_unexpected_key(text_saved, mesh2, reads, tmp_path):
    key = "model.layers.1.mlp.extra.weight"
    path = _text_copy(text_saved[QWEN_VL], tmp_path, lambda s: s | {key: torch.zeros(2)})
    with pytest.raises(CheckpointError, match=rf"does not: '{key}' \(-> 'model.language_model.layers.1.mlp.extra"):
        _load_text(QWEN_VL, path, mesh2)
    assert reads == []


def test_text_encoder_renames_unreachable(text_saved, mesh2, reads, monkeypatch):
    """Without transformers' conversion mapping, the old layout's keys are refused, named as stored and as expected."""
    import sys

    monkeypatch.setitem(sys.modules, "transformers.conversion_mapping", None)  # import fails
    with pytest.raises(CheckpointError, match=r"lacks 44 of Qwen2_5_VLForConditionalGeneration's tensors") as error:
        _load_text(QWEN_VL, text_saved[QWEN_VL], mesh2)
    message = str(error.value)
    assert "tensors: 'model.visual.patch_embed.proj.weight'," in message  # as the module names it
    assert "also holds 44 tensors Qwen2_5_VLForConditionalGeneration does not ('model.embed_tokens.weight'" in message
    assert reads == []


def test_text_encoder_conversion_that_splits_a_tensor(text_saved, mesh, reads, tmp_path, monkeypatch):
    """A key a transformers WeightConverter splits (fused qkv -> q, k, v) cannot be read by slices: refused, named."""
    import transformers.conversion_mapping as mapping
    from transformers.core_model_loading import Chunk, WeightConverter

    targets = [f"self_attn.{p}_proj.weight" for p in "qkv"]
    converter = WeightConverter(["self_attn.qkv.weight"], targets, operations=[Chunk(0)])
    monkeypatch.setattr(mapping, "get_model_conversion_mapping", lambda model, *a, **k: [converter])
    prefix = "encoder.layers.0.self_attn"

    def fuse(state):
        fused = torch.cat([state.pop(f"{prefix}.{p}_proj.weight") for p in "qkv"])
        return state | {f"{prefix}.qkv.weight": fused}

    path = _text_copy(text_saved[CLIP], tmp_path, fuse)
    with pytest.raises(CheckpointError, match=rf"'{prefix}.qkv.weight' needs transformers' conversion"):
        _load_text(CLIP, path, mesh)
    assert reads == []


def test_text_encoder_non_safetensors(text_saved, mesh, reads, tmp_path):
    (tmp_path / "config.json").write_text((text_saved[T5] / "config.json").read_text())
    torch.save(load_file(text_saved[T5] / TEXT_WEIGHTS), tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"non-safetensors weights \(pytorch_model.bin\)"):
        _load_text(T5, tmp_path, mesh)
    assert reads == []


def test_text_encoder_quantized(text_saved, mesh, reads, tmp_path):
    config = json.loads((text_saved[T5] / "config.json").read_text())
    path = _text_copy(text_saved[T5], tmp_path, lambda s: s)
    (path / "config.json").write_text(json.dumps(config | {"quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(CheckpointError, match=r"is quantized \(fp8\); shard-on-load reads unquantized"):
        _load_text(T5, path, mesh)
    assert reads == []


def test_text_encoder_plan_error_comes_before_the_checkpoint(text_saved, mesh, reads, tmp_path):
    """tp=4 does not divide a Qwen2.5-VL with 2 query heads: PlanError, the (garbage) weights never opened."""
    config = json.loads((text_saved[QWEN_VL] / "config.json").read_text())
    config["text_config"].update(num_attention_heads=2, num_key_value_heads=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / TEXT_WEIGHTS).write_bytes(b"not a safetensors file")
    with pytest.raises(dtp.PlanError) as error:
        _load_text(QWEN_VL, tmp_path, mesh)
    assert not isinstance(error.value, CheckpointError)
    assert reads == []
