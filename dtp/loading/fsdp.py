"""Shard-on-load under FSDP: the rows of a checkpoint tensor one rank holds, FSDP2's chunk of its TP slice.

FSDP2 (`fully_shard`) keeps, on fsdp rank f of F, chunk f of the parameter's local tensor along dim 0, as
`torch.chunk` cuts it (chunks of ceil(n / F) rows, the last ones short or empty). With TP inside, the local
tensor is this rank's TP slice (`Layout.local_slice`), so a rank holds

    torch.chunk(layout.local_slice(W, tp, t), F, dim=0)[f]          (layout None: W itself)

A vector (a bias, a norm weight) is left out of FSDP2 (`runtime/fsdp.fsdp_shards`): every fsdp rank holds its whole
tp slice, read as the one chunk of F = 1.

`fsdp_slice` reads exactly that from a safetensors slice without building the TP slice first:
- TP splits dim 0 (colwise, packed blocks, padding): the TP slice is a list of row pieces of W (`rank_pieces`:
  real rows, then zero rows); the FSDP chunk is a window [a, b) of their concatenation, so only the pieces (or
  parts of pieces) inside the window are read. Example: W of 6 rows in blocks (2, 4) at tp=2, rank 1 holds rows
  1:2 and 4:6 (3 rows); at F=2 fsdp rank 0 holds window [0, 2) = rows 1:2 and 4:5, fsdp rank 1 row 5:6.
- TP splits dim 1 (rowwise) or nothing: dim 0 is whole, the window is rows [a, b) of W, and TP's column slice
  is taken from those rows only.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor

from .. import quant
from ..engine import apply
from ..errors import PlanError
from ..resolve.layout import Layout, rank_pieces
from ..runtime.fsdp import fsdp_rows, fsdp_shards

Piece = tuple[int, int, int]  # real rows [start, stop) of the full tensor, then `zeros` zero rows


def tp_row_pieces(layout: Layout | None, rows: int, tp: int, tp_rank: int) -> list[Piece]:
    """The dim-0 pieces of W that make this TP rank's local tensor (all of dim 0 unless TP splits it)."""
    if layout is None or layout.dim != 0:
        return [(0, rows, 0)]
    return rank_pieces(layout.block_sizes, tp, tp_rank, layout.padded_sizes, layout.groups, layout.replicas)


def window(pieces: list[Piece], start: int, stop: int) -> list[Piece]:
    """The rows [start, stop) of the concatenation of `pieces`, as pieces of their own."""
    out, offset = [], 0
    for real_start, real_stop, zeros in pieces:
        real = real_stop - real_start
        lo, hi = max(start - offset, 0), min(stop - offset, real + zeros)
        if lo < hi:
            r0, r1 = min(lo, real), min(hi, real)
            out.append((real_start + r0, real_start + r1, (hi - lo) - (r1 - r0)))
        offset += real + zeros
    return out


class _Rows:
    """Rows [start, stop) of a tensor or safetensors slice, indexable like one (what `Layout.local_slice` takes)."""

    def __init__(self, source, start: int, stop: int):
        self.source, self.start, self.stop = source, start, stop

    def get_shape(self) -> list[int]:
        return [self.stop - self.start, *_shape(self.source)[1:]]

    def __getitem__(self, index) -> torch.Tensor:
        first = index[0]
        lo = self.start + (first.start or 0)
        hi = self.start + (self.stop - self.start if first.stop is None else first.stop)
        return self.source[(slice(lo, hi), *index[1:])]


def _shape(source) -> list[int]:
    return list(source.shape) if isinstance(source, torch.Tensor) else list(source.get_shape())


def fsdp_slice(source, layout: Layout | None, tp: int, tp_rank: int, fsdp: int, fsdp_rank: int) -> torch.Tensor:
    """This rank's FSDP chunk of its TP slice of `source` (a tensor or a safetensors slice), a new tensor."""
    shape = _shape(source)
    if not shape:  # a 0-d tensor: FSDP2 does not shard it
        return source[()].clone() if isinstance(source, torch.Tensor) else source[:].clone()
    pieces = tp_row_pieces(layout, shape[0], tp, tp_rank)
    length = sum(stop - start + zeros for start, stop, zeros in pieces)
    parts = []
    for start, stop, zeros in window(pieces, *fsdp_rows(length, fsdp, fsdp_rank)):
        rows = _Rows(source, start, stop)
        across = layout is not None and layout.dim != 0  # TP splits the columns of these rows
        real = layout.local_slice(rows, tp, tp_rank) if across else rows[(slice(None),) * len(shape)]
        parts.append(real)
        if zeros:
            parts.append(real.new_zeros([zeros, *real.shape[1:]]))
    if not parts:  # past the last chunk: an empty shard of the local tensor's width
        width = list(shape[1:]) if layout is None or layout.dim == 0 else list(layout.local_shape(shape, tp)[1:])
        return torch.empty([0, *width], dtype=_dtype(source))
    return torch.cat(parts) if len(parts) > 1 else parts[0].clone(memory_format=torch.contiguous_format)


def _dtype(source) -> torch.dtype:
    if isinstance(source, torch.Tensor):
        return source.dtype
    return source[(slice(0, 0),) * len(source.get_shape())].dtype


# ---------------------------------------------------------------------------------------------
# reading into a model sharded on meta

FSDP_QUANTIZED = (
    f"fsdp=True with quantization_config: {quant.FSDP_CANNOT}. Load with fsdp=False (TP divides quantized weights) or "
    f"without quantization."
)


def check_untied(model: nn.Module, keymap, directory) -> None:
    """PlanError when the checkpoint ties parameters (one tensor under two names) that the skeleton holds as two
    Parameters: FSDP2 would shard them apart. A tie the skeleton already shares (T5's `shared` and
    `encoder.embed_tokens`) is one FSDP2 parameter, read once."""
    untied = [(a, k) for a, k in keymap.aliases.items() if model.get_parameter(a) is not model.get_parameter(k)]
    if untied:
        raise PlanError(
            f"fsdp=True cannot load '{directory}': the checkpoint ties {untied[0][0]} to {untied[0][1]} ({len(untied)} "
            f"ties) but the model holds them as separate parameters; load it with fsdp=False."
        )


def read_fsdp(model: nn.Module, prepared, checkpoint, keymap, layouts, device, counting) -> int:
    """Shard the skeleton `model` on meta (`engine.apply`: TP, CP, cfg, FSDP2 units; nothing read), give it real
    storage on `device`, then fill every parameter's FSDP shard from the checkpoint (`fsdp_slice`: this rank's rows
    only; a vector FSDP2 leaves out, its whole tp slice) and every buffer whole; returns the bytes read.
    `counting` wraps each opened file (`load.CountingReader`).
    """
    buffers = dict(model.named_buffers())  # real: the skeleton builds them (non-persistent ones included)
    apply(model, replace(prepared, parallelism=prepared.parallelism.with_device(None)))
    model.to_empty(device=device)  # FSDP2 re-points its sharded parameters at the new storage
    for key, buffer in buffers.items():
        _set_buffer(model, key, buffer.to(device))
    tp, tp_rank = prepared.tp, prepared.tp_mesh.get_local_rank()
    fsdp_mesh = prepared.parallelism.fsdp_mesh
    fsdp, fsdp_rank = fsdp_mesh.size(), fsdp_mesh.get_local_rank()
    sources = {source: target for target, source in keymap.reads.items()}
    params = dict(model.named_parameters())
    bytes_read = 0
    for file, keys in checkpoint.keys_by_file().items():
        for source in (k for k in keys if k in sources):
            key = sources[source]
            with safe_open(file, framework="pt", device="cpu") as handle:  # one tensor per open: see load._read_into
                reader = counting(handle)
                if key in params:  # a vector FSDP2 leaves whole (fsdp_shards): its whole tp slice, one "chunk"
                    chunks, chunk = (fsdp, fsdp_rank) if fsdp_shards(params[key]) else (1, 0)
                    local = fsdp_slice(reader.get_slice(source), layouts.get(key), tp, tp_rank, chunks, chunk)
                else:
                    local = reader.get_tensor(source).clone()
            bytes_read += reader.bytes_read
            if key in params:
                with torch.no_grad():
                    _local(params[key]).copy_(local.to(params[key].dtype))
            else:
                _set_buffer(model, key, local.to(device=device, dtype=buffers[key].dtype))
    return bytes_read


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _set_buffer(model: nn.Module, key: str, value: torch.Tensor) -> None:
    module_path, _, name = key.rpartition(".")
    model.get_submodule(module_path)._buffers[name] = value
