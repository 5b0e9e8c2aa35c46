"""Shard-on-load: every rank reads only its own slice of each sharded tensor of a safetensors checkpoint.

    config.json -> model with parameters on meta (buffers real) -> engine.prepare      [no byte read yet]
    -> headers: files, shapes, truncation; keys and shapes against the model           [no byte read yet]
    -> per file, per tensor: get_slice -> slicing.local_slice (same math as the styles)
       -> cast -> device -> DTensor.from_local(Shard(dim)) | whole tensor
    -> engine.apply(weights_local=True): forward hooks + local head counts (no collective, nothing moved)

So a rank's host memory peaks near its own share, (sharded bytes) / tp + replicated bytes, instead
of the whole model (which is what `diffusers.from_pretrained` + `parallelize` costs on every rank).
Parameters come out on the rank's device; buffers, including the non-persistent ones a checkpoint
does not hold (built when the model is constructed, as diffusers does), follow them there.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from ..engine import apply, move_unsharded, prepare
from ..plan import Plan
from ..policy import check_float_dtype
from ..resolve import Layout
from ..runtime.mesh import tp_submesh
from ..runtime.placement import local_device
from ..runtime.styles import local_parameter
from .checkpoint import Checkpoint, TensorInfo, check_keys, open_checkpoint
from .meta import build_on_meta

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadStats:
    """What one rank read: `bytes_read` against the checkpoint's sharded and replicated totals."""

    rank: int
    tp: int
    bytes_read: int
    sharded_bytes: int  # checkpoint bytes of tensors the plan shards
    replicated_bytes: int  # checkpoint bytes of everything every rank reads whole
    seconds: float

    @property
    def share_bytes(self) -> int:
        """This rank's share of the checkpoint: sharded / tp + replicated."""
        return self.sharded_bytes // self.tp + self.replicated_bytes


def from_pretrained(
    model_class,
    path: str,
    mesh,
    plan: Plan | None = None,
    *,
    subfolder: str | None = None,
    torch_dtype: torch.dtype | None = None,
    device=None,
    cp_mode: str = "ulysses",
    pad: bool = False,
) -> nn.Module:
    """Build `model_class` from a diffusers folder, sharded on `mesh`'s `tp` axis, reading only this rank's slices.

    `plan` defaults to `plan_for(model_class)`; `torch_dtype` casts floating tensors after slicing
    (modules in `_keep_in_fp32_modules` stay float32, as in diffusers); `device` defaults to the
    mesh's device type at the local rank (`placement.local_device`). Everything that can be wrong
    (plan, TP degree, missing/unexpected keys, shapes, non-safetensors, truncated or corrupt
    files) raises `PlanError` (`checkpoint.CheckpointError` for the files) before a byte is read.
    On a mesh whose `cp` axis is > 1 the plan's cp section is applied as in `parallelize`
    (`cp_mode` "ulysses" or "ring"). `pad=True` zero-pads heads and widths tp does not divide (as in
    `parallelize`): each rank reads its real rows and makes its padded ones as zeros. Returns the model in eval mode.
    """
    model, _ = load(
        model_class,
        path,
        mesh,
        plan,
        subfolder=subfolder,
        torch_dtype=torch_dtype,
        device=device,
        cp_mode=cp_mode,
        pad=pad,
    )
    return model


def load(
    model_class, path, mesh, plan=None, *, subfolder=None, torch_dtype=None, device=None, cp_mode="ulysses", pad=False
):
    """`from_pretrained`, also returning this rank's `LoadStats`."""
    start = time.perf_counter()
    directory = os.path.join(path, subfolder) if subfolder else path
    check_float_dtype(torch_dtype)
    model = build_on_meta(model_class, directory, torch_dtype)
    target = local_device(device if device is not None else tp_submesh(mesh).device_type)
    prepared = prepare(model, mesh, plan, cp_mode=cp_mode, device=target, pad=pad)
    checkpoint = open_checkpoint(directory)
    check_keys(checkpoint, {k: tuple(v.shape) for k, v in model.state_dict().items()}, model_class.__name__)

    layouts = prepared.resolved.param_layouts()
    dtypes = _target_dtypes(model, torch_dtype)
    bytes_read = _read_into(model, checkpoint, layouts, dtypes, prepared.tp_mesh, target)
    move_unsharded(model, target)  # buffers the checkpoint does not hold (non-persistent ones)
    _assert_materialized(model)
    apply(model, prepared, weights_local=True)
    stats = _stats(checkpoint, layouts, prepared.tp_mesh, bytes_read, time.perf_counter() - start)
    logger.info(
        "dtp.from_pretrained rank %d: read %d of %d checkpoint bytes (share: sharded/%d + replicated = %d) in %.1f s",
        stats.rank,
        stats.bytes_read,
        stats.sharded_bytes + stats.replicated_bytes,
        stats.tp,
        stats.share_bytes,
        stats.seconds,
    )
    return model.eval(), stats


def _target_dtypes(model: nn.Module, torch_dtype) -> dict[str, torch.dtype]:
    """Each state-dict key's dtype in the model: the skeleton's own, float32 under `_keep_in_fp32_modules`."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    dtypes = {}
    for key, tensor in model.state_dict().items():
        fp32 = torch_dtype is not None and tensor.is_floating_point() and any(m in key.split(".") for m in keep)
        dtypes[key] = torch.float32 if fp32 else tensor.dtype
    return dtypes


# ---------------------------------------------------------------------------------------------
# reading


def _read_into(model, checkpoint: Checkpoint, layouts, dtypes, tp_mesh, device) -> int:
    """Read every tensor into `model`, in file order; returns the bytes read.

    Each tensor gets its own `safe_open`: the file is memory-mapped, and every page a slice touches
    counts in this process's RSS until the map is closed. Rowwise slices (strided columns) and
    whole replicated tensors touch most pages of their tensor, so a file kept open for all its
    tensors would add up to a whole shard file to the peak; closing after each tensor bounds the
    extra to one tensor. (Reopening costs one header parse, a few KB.)
    """
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    bytes_read = 0
    quiet = dist.is_initialized() and dist.get_rank() != 0
    with tqdm(total=len(checkpoint.tensors), desc="dtp load", unit="tensor", disable=quiet) as bar:
        for file, keys in checkpoint.keys_by_file().items():
            for key in keys:
                with safe_open(file, framework="pt", device="cpu") as handle:
                    counted = CountingReader(handle)
                    local = _read_one(counted, checkpoint.tensors[key], layouts.get(key), tp, rank)
                bytes_read += counted.bytes_read
                local = local.to(dtype=dtypes[key]).to(device)  # cast after slicing: only the slice
                _install(model, key, local, key in layouts, layouts.get(key), tp_mesh)
                bar.update()
    return bytes_read


class CountingReader:
    """A safetensors handle that counts the bytes of every tensor it hands out (what was read from the file)."""

    def __init__(self, handle):
        self.handle = handle
        self.bytes_read = 0

    def get_tensor(self, key: str) -> torch.Tensor:
        return self._count(self.handle.get_tensor(key))

    def get_slice(self, key: str) -> _CountingSlice:
        return _CountingSlice(self, self.handle.get_slice(key))

    def _count(self, tensor: torch.Tensor) -> torch.Tensor:
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor


class _CountingSlice:
    def __init__(self, reader: CountingReader, inner):
        self.reader, self.inner = reader, inner

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index) -> torch.Tensor:
        return self.reader._count(self.inner[index])


def _read_one(handle, info: TensorInfo, layout: Layout | None, tp: int, rank: int) -> torch.Tensor:
    """This rank's slice of a sharded tensor, or the whole tensor; always a copy (never a view of the map)."""
    if layout is None:
        return handle.get_tensor(info.key).clone()
    return layout.local_slice(handle.get_slice(info.key), tp, rank)


def _install(model: nn.Module, key: str, local: torch.Tensor, planned: bool, layout, tp_mesh) -> None:
    """Put `local` in place of the meta parameter (or the buffer) named `key`.

    A planned parameter becomes a DTensor (`styles.local_parameter`, as the styles make them), which
    `apply(weights_local=True)` keeps: `Shard(dim)` with its block layout, or `Replicate()` (a rowwise bias).
    """
    module_path, _, name = key.rpartition(".")
    module = model.get_submodule(module_path)
    if name not in module._parameters:
        module._buffers[name] = local
        return
    requires_grad = module._parameters[name].requires_grad
    if not planned:
        module._parameters[name] = nn.Parameter(local, requires_grad=requires_grad)
        return
    module._parameters[name] = local_parameter(local, layout, tp_mesh, requires_grad)


def _assert_materialized(model: nn.Module) -> None:
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    assert not left, f"left on meta after loading (check_keys should have caught this): {left[:5]}"


def _stats(checkpoint: Checkpoint, layouts, tp_mesh, bytes_read: int, seconds: float) -> LoadStats:
    sharded = sum(info.nbytes for key, info in checkpoint.tensors.items() if layouts.get(key) is not None)
    total = sum(info.nbytes for info in checkpoint.tensors.values())
    return LoadStats(
        rank=dist.get_rank() if dist.is_initialized() else 0,
        tp=tp_mesh.size(),
        bytes_read=bytes_read,
        sharded_bytes=sharded,
        replicated_bytes=total - sharded,
        seconds=seconds,
    )
