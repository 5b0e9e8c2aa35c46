"""A safetensors checkpoint, read from its headers only: which tensor lives where, and checks.

A diffusers model folder holds `config.json` and either one `diffusion_pytorch_model.safetensors`
or several shards plus `diffusion_pytorch_model.safetensors.index.json` (`weight_map`: key -> file);
a transformers one the same with `model.safetensors` (`text.WEIGHTS_NAME`).
A safetensors file is

    [8 bytes: header length N, little-endian u64][N bytes: JSON header][data]

where the header maps each key to `{dtype, shape, data_offsets: [begin, end]}` relative to the data
section. Everything here reads the headers only (a few KB per file), so every check below runs
before a single tensor byte is read and before the model is touched:
  * no safetensors weights (only `.bin` / `.pt`), a missing shard, an index naming a key its file lacks;
  * a corrupt header (bad length, bad JSON, unknown dtype, offsets that disagree with the shape);
  * a truncated file (the data section ends before the last tensor does);
  * missing keys, unexpected keys, shape mismatches against the model (`keys.match_keys`, which also
    maps renamed keys and lets one member of a tie stand for the others).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from ..errors import CheckpointError  # also importable from here, its old home

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
NON_SAFETENSORS_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".bin.index.json")

# safetensors dtype -> bytes per element
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
TORCH_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def dtype_of(name: str):
    """The torch dtype of a safetensors dtype name, None when torch has none (e.g. "U64" on older torch)."""
    import torch

    return getattr(torch, TORCH_DTYPES.get(name, ""), None)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the checkpoint header describes it."""

    key: str
    file: str  # absolute path of the safetensors file holding it
    dtype: str  # safetensors dtype name, e.g. "F32"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint folder, by key (validated headers, no data)."""

    directory: str
    tensors: dict[str, TensorInfo]

    @property
    def files(self) -> list[str]:
        return sorted({info.file for info in self.tensors.values()})

    def keys_by_file(self) -> dict[str, list[str]]:
        """`{file: [keys]}` in file order, so each file is opened once and closed before the next."""
        grouped: dict[str, list[str]] = {f: [] for f in self.files}
        for key, info in self.tensors.items():
            grouped[info.file].append(key)
        return grouped


def open_checkpoint(directory: str, weights_name: str = WEIGHTS_NAME) -> Checkpoint:
    """Locate the weights of a model folder (`weights_name`, or its shards and index) and validate every header."""
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"checkpoint '{directory}' is not a directory; pass a local diffusers model folder "
            f"(download it first, e.g. with huggingface_hub.snapshot_download)."
        )
    index_path = os.path.join(directory, weights_name + ".index.json")
    if os.path.isfile(index_path):
        return Checkpoint(directory, _tensors_from_index(directory, index_path))
    single = os.path.join(directory, weights_name)
    if os.path.isfile(single):
        return Checkpoint(directory, _tensors_of_file(single))
    raise CheckpointError(_no_weights_message(directory, weights_name))


def _no_weights_message(directory: str, weights_name: str) -> str:
    names = sorted(os.listdir(directory))
    other = [n for n in names if n.endswith(NON_SAFETENSORS_SUFFIXES)]
    if other:
        return (
            f"checkpoint '{directory}' holds non-safetensors weights ({', '.join(other)}); shard-on-load reads "
            f"safetensors only (pickled weights cannot be sliced without loading them whole). Convert once: load "
            f"the model with diffusers (or transformers) and call save_pretrained(..., safe_serialization=True)."
        )
    return (
        f"checkpoint '{directory}' has neither {weights_name} nor {weights_name}.index.json "
        f"(found: {', '.join(names) or 'nothing'}); "
        f"pass the model folder (or `subfolder=`, e.g. 'transformer' or 'text_encoder')."
    )


def _tensors_from_index(directory: str, index_path: str) -> dict[str, TensorInfo]:
    weight_map = _read_weight_map(index_path)
    tensors: dict[str, TensorInfo] = {}
    for name in sorted(set(weight_map.values())):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            keys = [k for k, v in weight_map.items() if v == name]
            raise CheckpointError(
                f"checkpoint index '{index_path}' names shard '{name}' ({len(keys)} tensors, e.g. '{keys[0]}'), "
                f"but the file is missing; download or copy every shard listed in the index."
            )
        for key, info in _tensors_of_file(path).items():
            if weight_map.get(key) == name:
                tensors[key] = info
    absent = [k for k in weight_map if k not in tensors]
    if absent:
        raise CheckpointError(
            f"checkpoint index '{index_path}' maps {len(absent)} keys to files that do not contain them "
            f"(e.g. '{absent[0]}' -> '{weight_map[absent[0]]}'); the index and the shards do not match."
        )
    return tensors


def _read_weight_map(index_path: str) -> dict[str, str]:
    try:
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"checkpoint index '{index_path}' is not a valid index ({error}); expected JSON with a `weight_map`."
        ) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"checkpoint index '{index_path}': `weight_map` must map tensor names to file names.")
    return weight_map


def read_header(path: str) -> tuple[int, dict]:
    """`(data_start, header)` of a safetensors file; CheckpointError when the header is unreadable."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"'{path}' is truncated or not a safetensors file: {size} bytes, no header length.")
        (length,) = struct.unpack("<Q", prefix)
        if length == 0 or length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(
                f"'{path}' is corrupt or truncated: header length {length} does not fit a file of {size} bytes."
            )
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"'{path}' is corrupt: its header is not valid JSON ({error}).") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"'{path}' is corrupt: its header is not a JSON object.")
    header.pop("__metadata__", None)
    return 8 + length, header


def _tensors_of_file(path: str) -> dict[str, TensorInfo]:
    """Every tensor of one file, after checking that each one's bytes lie inside the file."""
    data_start, header = read_header(path)
    data_size = os.path.getsize(path) - data_start
    tensors, spans = {}, []
    for key, entry in header.items():
        info, begin, end = _entry(path, key, entry)
        if end > data_size:
            raise CheckpointError(
                f"'{path}' is truncated: tensor '{key}' ends at byte {data_start + end} but the file has only "
                f"{data_start + data_size} bytes; download or copy the file again."
            )
        tensors[key] = info
        spans.append((begin, end, key))
    _check_no_overlap(path, spans)
    return tensors


def _entry(path: str, key: str, entry) -> tuple[TensorInfo, int, int]:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        valid = dtype in DTYPE_SIZES and all(isinstance(d, int) and d >= 0 for d in shape)
        valid = valid and isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise CheckpointError(f"'{path}' is corrupt: header entry '{key}' is malformed ({entry!r:.200}).")
    info = TensorInfo(key, os.path.abspath(path), dtype, shape)
    if end - begin != info.nbytes:
        raise CheckpointError(
            f"'{path}' is corrupt: tensor '{key}' ({dtype}, shape {list(shape)}) needs {info.nbytes} bytes but its "
            f"offsets [{begin}, {end}) span {end - begin}."
        )
    return info, begin, end


def _check_no_overlap(path: str, spans: list[tuple[int, int, str]]) -> None:
    spans.sort()
    for (_, prev_end, prev_key), (begin, _, key) in zip(spans, spans[1:]):
        if begin < prev_end:
            raise CheckpointError(f"'{path}' is corrupt: tensors '{prev_key}' and '{key}' overlap in the data section.")
