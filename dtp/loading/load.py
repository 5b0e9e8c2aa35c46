"""Shard-on-load: every rank reads only its own slice of each sharded tensor of a safetensors checkpoint.

    config.json -> model with parameters on meta (buffers real) -> engine.prepare      [no byte read yet]
    -> headers: files, shapes, truncation; keys and shapes against the model           [no byte read yet]
       (transformers models: renamed keys mapped, one member of a tie read, ignored keys skipped; `text.py`)
    -> per file, per tensor: get_slice -> slicing.local_slice (same math as the styles)
       -> cast -> device -> DTensor.from_local(Shard(dim)) | whole tensor
    -> engine.apply(weights_local=True): the styles' forwards + local head counts (no collective, nothing moved)

So a rank's host memory peaks near its own share, (sharded bytes) / tp + replicated bytes, instead
of the whole model (which is what `diffusers.from_pretrained` + `parallelize` costs on every rank).
Parameters come out on the rank's device; buffers, including the non-persistent ones a checkpoint
does not hold (built when the model is constructed, as diffusers does), follow them there.

Both libraries load this way: a diffusers model (a transformer) from `diffusion_pytorch_model.safetensors`
on the whole ("cp", "tp") mesh, a transformers model (a text encoder) from `model.safetensors` on the
mesh's `tp` axis only (`Parallelism.for_model`: text encoders have no sequence split).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from ..engine import apply, move_unsharded, prepare_with
from ..errors import PlanError
from ..plan import Plan
from ..plan.transformers import is_transformers_model
from ..policy import check_float_dtype
from ..quant import LoadQuantizer
from ..resolve import Layout
from ..runtime.fsdp import fsdp_shards
from ..runtime.mesh import tp_submesh
from ..runtime.parallelism import Parallelism
from ..runtime.placement import local_device
from ..styles import local_parameter
from . import text
from .checkpoint import WEIGHTS_NAME, Checkpoint, CheckpointError, TensorInfo, open_checkpoint
from .fsdp import FSDP_QUANTIZED, check_untied, read_fsdp
from .keys import KeyMap, model_keymap
from .meta import build_on_meta
from .prequantized import QuantizedInfo, install_quantized, quantize_skeleton, read_quantized, torchao_view

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
    shared_bytes: int = 0  # extra reads of shared kv heads: (replicas - 1) x their bytes (resolve/kv_share.py)
    fsdp: int = 1  # the ranks FSDP divides each tensor over (fsdp=True), else 1
    whole_sharded_bytes: int = 0  # of sharded_bytes, the tensors FSDP leaves whole (vectors: runtime/fsdp_shards)
    whole_replicated_bytes: int = 0  # of replicated_bytes, the same

    @property
    def share_bytes(self) -> int:
        """This rank's share of the checkpoint: ((sharded + shared) / tp + replicated) / fsdp, the vectors FSDP
        leaves whole (`whole_*`) not divided by fsdp.

        A kv projection shared by R ranks is read by each of them in tp / R parts, so the ranks
        together read it R times: Qwen2.5-VL-7B at tp=8 reads k_proj/v_proj twice over.
        """
        sharded, replicated = self.sharded_bytes - self.whole_sharded_bytes, self.replicated_bytes
        divided = ((sharded + self.shared_bytes) // self.tp + replicated - self.whole_replicated_bytes) // self.fsdp
        return divided + self.whole_sharded_bytes // self.tp + self.whole_replicated_bytes


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
    quantization_config=None,
    fsdp: bool | int | str = False,
    attention_backend: str | None = None,
) -> nn.Module:
    """Build `model_class` from a diffusers or transformers folder, sharded on `mesh`'s `tp` axis, reading only
    this rank's slices.

    `model_class`: a diffusers model (e.g. FluxTransformer2DModel) or a transformers one with a plan
    (a text encoder: T5EncoderModel, CLIPTextModel, Qwen2_5_VLForConditionalGeneration, ...; it runs on
    the mesh's `tp` axis, the same on every cp rank). `plan` defaults to `plan_for(model_class)`;
    `torch_dtype` casts floating tensors after slicing (modules in `_keep_in_fp32_modules` stay float32,
    as each library does; None: the skeleton's default dtype for diffusers, transformers' "auto" for
    transformers); `device` defaults to the mesh's device type at the local rank (`placement.local_device`).
    Everything that can be wrong (plan, TP degree, missing/unexpected keys, shapes, non-safetensors,
    truncated or corrupt files, a transformers key conversion that is not a plain rename) raises
    `PlanError` (`checkpoint.CheckpointError` for the files) before a byte is read.
    On a mesh whose `cp` axis is > 1 the plan's cp section is applied as in `parallelize`
    (`cp_mode` "ulysses" or "ring"). `pad=True` zero-pads heads and widths tp does not divide (as in
    `parallelize`): each rank reads its real rows and makes its padded ones as zeros. Returns the model in eval mode.
    `quantization_config` (diffusers' `TorchAoConfig`, or a torchao config; int8 / float8 weight-only): each
    rank quantizes its slice of every Linear weight as it is read, with the whole row's scales (`dtp/quant/load.py`).
    `fsdp=True`: the weights are sharded over the mesh's non-tp axes too (FSDP2, as `dtp.parallelize(fsdp=True)`),
    and each rank reads only its FSDP shard of its TP slice of every tensor (`loading/fsdp.py`); a unit size
    (`fsdp=2`, `fsdp="1GB"`) groups blocks into units as there (docs/fsdp.md, "Unit size").
    `attention_backend`: as in `dtp.parallelize` (set on the model; Ulysses and ring use it).
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
        quantization_config=quantization_config,
        fsdp=fsdp,
        attention_backend=attention_backend,
    )
    return model


def load(
    model_class,
    path,
    mesh,
    plan=None,
    *,
    subfolder=None,
    torch_dtype=None,
    device=None,
    cp_mode="ulysses",
    pad=False,
    quantization_config=None,
    fsdp=False,
    attention_backend=None,
):
    """`from_pretrained`, also returning this rank's `LoadStats`."""
    target = local_device(device if device is not None else tp_submesh(mesh).device_type)
    options = dict(cp_mode=cp_mode, pad=pad, device=target, fsdp=fsdp, attention_backend=attention_backend)
    parallelism = Parallelism.build(mesh, **options)
    directory = os.path.join(path, subfolder) if subfolder else path
    return load_with(model_class, directory, parallelism, plan, torch_dtype, quantization_config)


def load_with(model_class, directory, parallelism: Parallelism, plan=None, torch_dtype=None, quantization_config=None):
    """`load` for callers that hold the parallel setup (`pipeline/load.py`): (model, this rank's LoadStats)."""
    start = time.perf_counter()
    model = build_skeleton(model_class, directory, torch_dtype)
    quantizer = LoadQuantizer(model, quantization_config) if quantization_config is not None else None
    prepared = prepare_with(model, parallelism.for_model(model), plan)
    stats = load_prepared(model, prepared, directory, torch_dtype, start=start, quantizer=quantizer)
    return model, stats


def build_skeleton(model_class, directory: str, torch_dtype: torch.dtype | None = None) -> nn.Module:
    """`model_class` from `directory`/config.json, parameters on meta and buffers real: what `engine.prepare`
    checks and `load_prepared` fills. Nothing of the weights is read (a transformers config without a dtype
    has "auto" resolved from the checkpoint's headers)."""
    check_float_dtype(torch_dtype)
    if not text.is_transformers_class(model_class):
        model = build_on_meta(model_class, directory, torch_dtype)
        if getattr(model.config, "quantization_config", None):  # saved already quantized by torchao
            quantize_skeleton(model, torchao_view(open_checkpoint(directory)))
        return model
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise CheckpointError(
            f"checkpoint '{directory}' has no config.json; pass the model folder "
            f"(or `subfolder=`, e.g. 'text_encoder')."
        )
    config = text.load_text_config(model_class, directory)
    dtype = torch_dtype or text.auto_dtype(config, lambda: open_checkpoint(directory, text.WEIGHTS_NAME))
    return text.build_text_on_meta(model_class, config, dtype, directory)


def open_model_checkpoint(directory: str, transformers_model: bool) -> Checkpoint:
    """The checkpoint a model of either library loads from: transformers' or diffusers' weights file, a diffusers
    one seen through `torchao_view` (a weight saved quantized by torchao: its pieces under one key)."""
    if transformers_model:
        return open_checkpoint(directory, text.WEIGHTS_NAME)
    return torchao_view(open_checkpoint(directory, WEIGHTS_NAME))


def load_prepared(
    model: nn.Module, prepared, directory: str, torch_dtype=None, *, start=None, quantizer=None
) -> LoadStats:
    """Fill the skeleton `model` (from `build_skeleton`, checked by `engine.prepare` into `prepared`) from the
    checkpoint in `directory`, this rank's slices only, and shard it (`engine.apply`); returns what it read.

    Every header and key check runs before a byte is read and before the model is touched.
    """
    start = time.perf_counter() if start is None else start
    transformers_model = is_transformers_model(model)
    checkpoint = open_model_checkpoint(directory, transformers_model)
    keymap = model_keymap(model, checkpoint, transformers_model)
    target = prepared.device if prepared.device is not None else local_device(prepared.tp_mesh.device_type)
    layouts = prepared.resolved.param_layouts() if prepared.tp > 1 else {}  # tp=1: plain tensors, read whole
    dtypes = _target_dtypes(model, torch_dtype, transformers_model)
    if prepared.parallelism.fsdp:
        if quantizer is not None:
            raise PlanError(FSDP_QUANTIZED)
        check_untied(model, keymap, directory)
        bytes_read = read_fsdp(model, prepared, checkpoint, keymap, layouts, target, CountingReader)
    else:
        bytes_read = _read_into(model, checkpoint, keymap, layouts, dtypes, prepared.tp_mesh, target, quantizer)
        move_unsharded(model, target)  # buffers the checkpoint does not hold (non-persistent ones)
        _assert_materialized(model)
        apply(model, prepared, weights_local=True)
    model.eval()
    stats = _stats(checkpoint, keymap, layouts, prepared.tp_mesh, bytes_read, time.perf_counter() - start)
    if prepared.parallelism.fsdp:
        stats = replace(
            stats, fsdp=prepared.parallelism.fsdp_degree, **_whole_under_fsdp(model, checkpoint, keymap, layouts)
        )
    logger.info(
        "dtp.from_pretrained rank %d: read %d of %d checkpoint bytes (share: sharded/%d + replicated = %d) in %.1f s",
        stats.rank,
        stats.bytes_read,
        stats.sharded_bytes + stats.replicated_bytes,
        stats.tp,
        stats.share_bytes,
        stats.seconds,
    )
    return stats


def _target_dtypes(model: nn.Module, torch_dtype, transformers_model: bool = False) -> dict[str, torch.dtype]:
    """Each state-dict key's dtype in the model: the skeleton's own, float32 where the library keeps it so
    (diffusers: `_keep_in_fp32_modules` under any `torch_dtype`; transformers: its dtype plan,
    `text.fp32_predicate`)."""
    if transformers_model:
        fp32 = text.fp32_predicate(model, model.config.dtype)
    else:
        keep = getattr(model, "_keep_in_fp32_modules", None) or []
        fp32 = lambda key: torch_dtype is not None and any(m in key.split(".") for m in keep)  # noqa: E731
    return {
        key: torch.float32 if tensor.is_floating_point() and fp32(key) else tensor.dtype
        for key, tensor in model.state_dict().items()
    }


# ---------------------------------------------------------------------------------------------
# reading


def _read_into(model, checkpoint: Checkpoint, keymap: KeyMap, layouts, dtypes, tp_mesh, device, quantizer=None) -> int:
    """Read every tensor of `keymap.reads` into `model`, in file order, then give each tie alias its
    member's Parameter; returns the bytes read.

    Each tensor gets its own `safe_open`: the file is memory-mapped, and every page a slice touches
    counts in this process's RSS until the map is closed. Rowwise slices (strided columns) and
    whole replicated tensors touch most pages of their tensor, so a file kept open for all its
    tensors would add up to a whole shard file to the peak; closing after each tensor bounds the
    extra to one tensor. (Reopening costs one header parse, a few KB.)
    """
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    bytes_read = 0
    quiet = dist.is_initialized() and dist.get_rank() != 0
    sources = {source: target for target, source in keymap.reads.items()}
    with tqdm(total=len(sources), desc="dtp load", unit="tensor", disable=quiet) as bar:
        for file, keys in checkpoint.keys_by_file().items():
            for source in (k for k in keys if k in sources):
                key = sources[source]
                if isinstance(checkpoint.tensors[source], QuantizedInfo):  # saved quantized: prequantized.py
                    layout = layouts.get(key)
                    weight, count = read_quantized(checkpoint.tensors[source], layout, tp_mesh, device, CountingReader)
                    install_quantized(model, key, weight, layout)
                    bytes_read += count
                    bar.update()
                    continue
                with safe_open(file, framework="pt", device="cpu") as handle:
                    counted = CountingReader(handle)
                    local = _read_one(counted, checkpoint.tensors[source], layouts.get(key), tp, rank)
                bytes_read += counted.bytes_read
                local = local.to(dtype=dtypes[key]).to(device)  # cast after slicing: only the slice
                _install(model, key, local, key in layouts, layouts.get(key), tp_mesh)
                if quantizer is not None:  # a selected Linear weight: quantized now, before the next read
                    del local  # the model holds the slice; without this name it is freed once quantized
                    quantizer(model, key, layouts.get(key))
                bar.update()
    for alias, key in keymap.aliases.items():  # one tied Parameter: read once, installed under every name
        module_path, _, name = alias.rpartition(".")
        model.get_submodule(module_path)._parameters[name] = model.get_parameter(key)
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
    assert not left, f"left on meta after loading (match_keys should have caught this): {left[:5]}"


def _whole_under_fsdp(model: nn.Module, checkpoint: Checkpoint, keymap: KeyMap, layouts) -> dict:
    """`LoadStats`' whole_sharded_bytes / whole_replicated_bytes: the checkpoint bytes of the parameters FSDP2 leaves
    whole on every fsdp rank (`runtime/fsdp.fsdp_shards`: vectors), split as `_stats` splits the totals."""
    params = dict(model.named_parameters())
    nbytes = _read_bytes(checkpoint, keymap)
    whole = {key: n for key, n in nbytes.items() if key in params and not fsdp_shards(params[key])}
    sharded = _sharded(whole, layouts)
    return dict(whole_sharded_bytes=sharded, whole_replicated_bytes=sum(whole.values()) - sharded)


def _read_bytes(checkpoint: Checkpoint, keymap: KeyMap) -> dict[str, int]:
    """Checkpoint bytes of each tensor read, by key (a tie's duplicate and ignored keys are not read)."""
    return {key: checkpoint.tensors[source].nbytes for key, source in keymap.reads.items()}


def _sharded(nbytes: dict[str, int], layouts) -> int:
    """Of `nbytes`, the bytes of the tensors TP slices (a layout); the rest are replicated."""
    return sum(n for key, n in nbytes.items() if layouts.get(key) is not None)


def _stats(checkpoint: Checkpoint, keymap: KeyMap, layouts, tp_mesh, bytes_read: int, seconds: float) -> LoadStats:
    """Totals over the tensors read (a tie's duplicate and ignored keys are not read, so not counted)."""
    nbytes = _read_bytes(checkpoint, keymap)
    sharded = _sharded(nbytes, layouts)
    shared = sum(n * (layouts[key].replicas - 1) for key, n in nbytes.items() if layouts.get(key) is not None)
    total = sum(nbytes.values())
    return LoadStats(
        rank=dist.get_rank() if dist.is_initialized() else 0,
        tp=tp_mesh.size(),
        bytes_read=bytes_read,
        sharded_bytes=sharded,
        replicated_bytes=total - sharded,
        seconds=seconds,
        shared_bytes=shared,
    )
