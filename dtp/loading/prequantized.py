"""Shard-on-load of a checkpoint saved already quantized by torchao: each rank reads its slice of the pieces.

diffusers (0.42) saves a model loaded with `TorchAoConfig(...)` through torchao's
`flatten_tensor_state_dict` (torchao >= 0.16): a quantized Linear weight `<m>.weight` is stored as

    <m>._weight_qdata        int8 / float8_e4m3fn [N, K]
    <m>._weight_scale        float32 [N, 1] (per row) or [1, 1] (per tensor)
    <m>._weight_zero_point   int8, like scale (Int8Tensor; zeros for symmetric int8)

and the file's safetensors metadata holds, under "<m>.weight", a JSON object
`{"_type": "Int8Tensor", "_data": {"block_size": [1, K], "dtype": ..., "act_quant_kwargs": ...},
"_tensor_data_names": ["zero_point", "qdata", "scale"]}` ("tensor_names" lists every state-dict key;
a plain tensor is `{"_type": "Tensor"}`); config.json carries `quantization_config` (quant_method torchao).

dtp reads it in three steps, each the same as for an unquantized checkpoint:
  1. `quantize_skeleton`: every quantized weight of the meta skeleton becomes the same torchao class on meta
     (pieces with the saved shapes), so `prepare` checks it like a model quantized in memory
     (`quant.check_quantized`: per-group scales, int8 dynamic activation on a rowwise layer, ... are
     PlanErrors naming the module and the scheme) and the ranks agree on it (the fingerprint);
  2. `torchao_view`: the pieces of each weight are one `QuantizedInfo` under `<m>.weight` (qdata's shape), so
     key matching and the plan's layouts see the model's own keys;
  3. `read_quantized`: the pieces are cut with `quant.shard_pieces` from the file (qdata's rows and their
     scales for colwise; qdata's columns and the whole scales for rowwise; padded rows data 0, scale 1), and
     the weight is rebuilt as its class around DTensors: what `dtp.parallelize` makes of diffusers' own
     one-process load of the same folder, bit for bit. One weight's slice is in flight at a time.
Any other torchao class (Int4Tensor, MXTensor, ...) is a CheckpointError naming the parameter, before a read.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
from safetensors import safe_open
from torch import nn

from ..errors import PlanError
from ..quant import config_for, shard_pieces, sharded_parameter
from ..quant.dynamic import install_dynamic_rowwise
from ..quant.kinds import SUPPORTED_CLASSES
from ..quant.load import check_runnable
from ..quant.shard import sharded_block_size
from .checkpoint import Checkpoint, CheckpointError, TensorInfo, dtype_of

PIECES = ("qdata", "scale", "zero_point")  # the torchao tensor data dtp slices (kinds.py: per row / per tensor)


@dataclass(frozen=True)
class QuantizedInfo(TensorInfo):
    """A torchao-quantized weight saved flattened: `shape` and `dtype` are its qdata's; `pieces` its stored
    tensors by torchao data name; `meta` the metadata object (class name, attributes)."""

    pieces: dict[str, TensorInfo] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(piece.nbytes for piece in self.pieces.values())

    @property
    def cls(self) -> str:
        return self.meta.get("_type", "?")


def torchao_metadata(files) -> dict[str, dict]:
    """{state-dict key: metadata object} of every torchao tensor subclass the files' metadata describe (merged
    over the files, as diffusers does); {} for a checkpoint without torchao metadata. Reads headers only."""
    merged: dict[str, str] = {}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as handle:
            merged.update(handle.metadata() or {})
    try:
        names = json.loads(merged.get("tensor_names", "[]"))
        objects = {name: json.loads(merged[name]) for name in names if name in merged}
    except (TypeError, json.JSONDecodeError):
        return {}
    return {n: value for n, value in objects.items() if isinstance(value, dict) and value.get("_type") != "Tensor"}


def torchao_view(checkpoint: Checkpoint) -> Checkpoint:
    """`checkpoint` with each torchao weight's pieces (`<m>._weight_<piece>`) replaced by one `QuantizedInfo`
    under `<m>.weight`; the same checkpoint when it holds none. CheckpointError for a class dtp cannot slice
    or a weight with missing or extra pieces."""
    quantized = torchao_metadata(checkpoint.files)
    if not quantized:
        return checkpoint
    tensors = dict(checkpoint.tensors)
    for name, meta in quantized.items():
        pieces = {piece: tensors.pop(_piece_key(name, piece)) for piece in _piece_names(checkpoint, name, meta)}
        qdata = pieces["qdata"]
        tensors[name] = QuantizedInfo(name, qdata.file, qdata.dtype, qdata.shape, pieces=pieces, meta=meta)
    return Checkpoint(checkpoint.directory, tensors)


def _piece_key(name: str, piece: str) -> str:
    """torchao's flattened key: "a.b.weight", "scale" -> "a.b._weight_scale"."""
    module_path, _, param = name.rpartition(".")
    return f"{module_path}._{param}_{piece}"


def _piece_names(checkpoint: Checkpoint, name: str, meta: dict) -> list[str]:
    """The stored pieces of the weight `name`, after checking its class and that each is in the files."""
    cls, names = meta.get("_type"), list(meta.get("_tensor_data_names") or [])
    if cls not in SUPPORTED_CLASSES or not {"qdata", "scale"} <= set(names) or not set(names) <= set(PIECES):
        raise CheckpointError(
            f"checkpoint '{checkpoint.directory}': parameter '{name}' was saved as torchao {cls} with data "
            f"{names}, which dtp does not slice (supported: {', '.join(SUPPORTED_CLASSES)} with qdata, scale and an "
            f"optional zero_point: Int8WeightOnlyConfig, Float8WeightOnlyConfig, "
            f"Float8DynamicActivationFloat8WeightConfig). Load the unquantized (bf16) checkpoint with "
            f"quantization_config=TorchAoConfig(Int8WeightOnlyConfig()) or Float8WeightOnlyConfig(), or load this "
            f"one whole with diffusers' from_pretrained."
        )
    absent = [_piece_key(name, piece) for piece in names if _piece_key(name, piece) not in checkpoint.tensors]
    if absent:
        raise CheckpointError(
            f"checkpoint '{checkpoint.directory}': parameter '{name}' (torchao {cls}) lacks its stored pieces "
            f"{absent}; the weights and their metadata do not match (save the model again)."
        )
    return names


def quantize_skeleton(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Every weight `checkpoint` (a `torchao_view`) holds quantized becomes, in the meta skeleton, the same
    torchao class with meta pieces of the saved shapes: what `prepare` then checks (nothing is read).
    PlanError first when a weight's scheme cannot run here (float8 dynamic activation off a recent GPU)."""
    for name, info in checkpoint.tensors.items():
        if isinstance(info, QuantizedInfo) and _is_linear_weight(model, name):
            _check_runnable(name, info)
            module_path, _, param = name.rpartition(".")
            meta = {n: torch.empty(p.shape, dtype=dtype_of(p.dtype), device="meta") for n, p in info.pieces.items()}
            model.get_submodule(module_path)._parameters[param] = nn.Parameter(_build(info, meta), False)


def _check_runnable(name: str, info: QuantizedInfo) -> None:
    """A Float8Tensor saved with `act_quant_kwargs` (float8 dynamic activation) runs on torchao's float8 matmul
    only (CUDA capability >= 8.9): PlanError naming the parameter elsewhere, as `quant.load.check_runnable` does
    for a quantization_config (which it calls)."""
    if info.cls != "Float8Tensor" or not info.meta["_data"].get("act_quant_kwargs"):
        return
    try:
        check_runnable(config_for("fp8"), None)
    except PlanError as error:
        raise PlanError(
            f"parameter '{name}' was saved as torchao Float8Tensor with float8 dynamic activation: {error} For a "
            f"folder saved quantized: run it on such a GPU, or load its unquantized original with "
            f"quantization_config=TorchAoConfig(Float8WeightOnlyConfig())."
        ) from None


def _is_linear_weight(model: nn.Module, name: str) -> bool:
    """Whether `name` is a Linear's weight; anything else stays as it is (key matching then refuses it)."""
    module_path, _, param = name.rpartition(".")
    try:
        return param == "weight" and isinstance(model.get_submodule(module_path), nn.Linear)
    except AttributeError:
        return False


def _build(info: QuantizedInfo, data: dict, block_size=None):
    """The torchao tensor of `info`'s class from its saved attributes and `data` (pieces: tensors or DTensors),
    with `block_size` in place of the saved one when given (a sharded weight's: global, padded)."""
    from torchao.prototype.safetensors.safetensors_utils import object_from_dict

    attributes = dict(info.meta["_data"]) | data
    if block_size is not None:
        attributes["block_size"] = block_size
    return object_from_dict({"_type": info.cls, "_data": attributes})


def read_quantized(info: QuantizedInfo, layout, mesh, device, counting) -> tuple[torch.Tensor, int]:
    """(this rank's weight for `info`, bytes read): its class around DTensor pieces cut as `layout` says
    (`shard_pieces`), or the whole weight, plain, when the plan does not shard it. `counting` wraps each opened
    file (`load.CountingReader`); each file is open only while this weight is read (see `load._read_into`)."""
    with ExitStack() as stack:
        files = {p.file for p in info.pieces.values()}
        readers = {f: counting(stack.enter_context(safe_open(f, framework="pt", device="cpu"))) for f in files}
        sources = {piece: readers[p.file].get_slice(p.key) for piece, p in info.pieces.items()}
        if layout is None:
            weight = _build(info, {piece: _whole(source, device) for piece, source in sources.items()})
        else:
            qdata, scale, zero_point = shard_pieces(
                sources["qdata"], sources["scale"], sources.get("zero_point"), layout, mesh, device
            )
            pieces = {"qdata": qdata, "scale": scale} | ({} if zero_point is None else {"zero_point": zero_point})
            block_size = sharded_block_size(info.meta["_data"]["block_size"], info.shape, qdata.shape)
            weight = _build(info, pieces, block_size)
    return weight, sum(reader.bytes_read for reader in readers.values())


def _whole(source, device) -> torch.Tensor:
    return source[:].to(device)


def install_quantized(model: nn.Module, key: str, weight, layout) -> None:
    """Put the read weight in place of the skeleton's meta one: a frozen Parameter, its layout recorded when
    sharded (as `dtp.parallelize` does), and float8 dynamic activation's whole-token scales on rowwise layers."""
    module_path, _, name = key.rpartition(".")
    module = model.get_submodule(module_path)
    module._parameters[name] = nn.Parameter(weight, False) if layout is None else sharded_parameter(weight, layout)
    install_dynamic_rowwise(module)
