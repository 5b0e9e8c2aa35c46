"""`load_lora` / `load_lora_weights`: diffusers LoRAs on a dtp-sharded transformer, exact.

diffusers and peft do the loading: format conversion (the pipelines' `lora_state_dict`,
`load_lora_adapter`), LoraConfig (ranks, alphas), injection and every later adapter method
(`set_adapters`, `disable_lora`/`enable_lora`, `delete_adapters`, `fuse_lora`/`unfuse_lora`).
peft (>= 0.19) sizes an adapter on a DTensor base from the base's *local* weight, so each rank
hands it this rank's piece of every split factor; dtp adds only the three steps around that:

  1. check (keys.py): every key names a Linear of the model with fitting shapes; PlanError first;
  2. cut (shard.py): this rank's piece of each factor the base splits (`Layout.local_slice`);
  3. place (shard.py): after `load_lora_adapter`, the loaded pieces become DTensors with the base's
     style (the rank-r all-reduce of a rowwise base, the all-gather of a gathered one).

Example: FLUX.1 tiny at tp=2, rank-4 LoRA on every Linear: `to_q` (64 -> 64, colwise) gets
A [4, 64] whole and B rows 32*rank : 32*(rank+1); `to_out.0` (rowwise) gets A columns 32*rank : ...
and B [64, 4] whole.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass
from importlib.metadata import version

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..errors import PlanError
from ..quant import is_quantized
from ..runtime.cp import move_cp_hooks
from ..runtime.fsdp import is_fsdp
from .fsdp import check_lora_fsdp, forward_sizes, merge_into_shards, tp_submesh
from .keys import LORA_KEY, base_linear, check_lora, peft_view, read_lora
from .quantized import local_features, requantize_on_merge, sharded_data
from .shard import PARTS, local_tensor, place_adapter, planned_spec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraStats:
    """One rank's view of one loaded adapter: its name, and bytes held here vs in the whole adapter."""

    adapter_name: str
    rank: int
    tp: int
    local_bytes: int  # adapter bytes this rank holds (its pieces of split factors + whole factors)
    full_bytes: int  # bytes of the whole adapter (what each rank would hold unsharded)
    sharded_modules: int  # adapted Linears whose base is sharded
    modules: int  # adapted Linears


def load_lora(
    model: nn.Module,
    lora,
    *,
    adapter_name: str | None = None,
    prefix: str | None = "transformer",
    network_alphas: dict | None = None,
    metadata: dict | None = None,
) -> LoraStats:
    """Load a diffusers LoRA (state dict, file or folder) into a dtp-sharded `model`, split like its bases.

    Same arguments as diffusers' `model.load_lora_adapter`. Raises PlanError, with the model
    unchanged, when a key names no Linear of the model or a shape does not fit its base layer.
    Afterwards diffusers' adapter methods on `model` work as on an unsharded model.
    """
    if not hasattr(model, "load_lora_adapter"):  # diffusers' PeftAdapterMixin, which dtp loads through
        raise PlanError(
            f"{type(model).__name__} takes no LoRA in diffusers (it has no PeftAdapterMixin, so no load_lora_adapter); "
            f"dtp loads LoRAs through diffusers' loader. Fuse the LoRA into the weights before sharding instead."
        )
    state_dict, file_metadata = read_lora(lora)
    peft_sd = peft_view(state_dict, prefix)
    fsdp = is_fsdp(model)
    if fsdp:
        check_lora_fsdp(peft_sd, prefix)
    from diffusers.utils.peft_utils import get_adapter_name  # here: diffusers' import costs seconds

    adapter_name = adapter_name or get_adapter_name(model)
    targets = check_lora(model, peft_sd, adapter_name, prefix)
    specs = {t.path: planned_spec(base_linear(model, t.path)) for t in targets}
    mesh = _tp_mesh(model, specs)
    tp, rank = (1, 0) if mesh is None else (mesh.size(), mesh.get_local_rank())

    local_sd = {key: _local(key, tensor, specs, tp, rank) for key, tensor in peft_sd.items()}
    if not fsdp:  # with fsdp, forward_sizes gives peft the sizes
        _check_peft_sizes_locally(model, specs)
    sizes = forward_sizes(model, specs, tp) if fsdp else contextlib.nullcontext()
    with sizes, local_features(base_linear(model, path) for path, spec in specs.items() if spec is not None):
        model.load_lora_adapter(
            {f"{prefix}.{k}": v for k, v in local_sd.items()} if prefix else local_sd,
            prefix=prefix,
            adapter_name=adapter_name,
            network_alphas=network_alphas,
            metadata=metadata if metadata is not None else file_metadata,
        )
    _install(model, adapter_name, specs, mesh, fsdp)
    stats = _stats(model, adapter_name, peft_sd, specs, tp, rank)
    logger.info(
        "dtp.load_lora rank %d: adapter '%s' holds %d of %d adapter bytes (tp=%d, %d of %d adapted Linears sharded)",
        stats.rank,
        stats.adapter_name,
        stats.local_bytes,
        stats.full_bytes,
        stats.tp,
        stats.sharded_modules,
        stats.modules,
    )
    return stats


def _install(model: nn.Module, adapter_name: str, specs: dict, mesh, fsdp: bool) -> None:
    """After peft loaded `adapter_name`: each adapted layer's pieces placed like its base, its merge made to fit."""
    for path, spec in specs.items():
        move_cp_hooks(model, base_linear(model, path), model.get_submodule(path))  # cp splits/gathers the sum
        if spec is not None:
            place_adapter(model.get_submodule(path), adapter_name, spec, mesh)
        if fsdp:  # fuse_lora writes into FSDP's shards
            merge_into_shards(model, model.get_submodule(path))
        if is_quantized(base_linear(model, path).weight):  # peft's TorchaoLoraLinear: merge re-quantizes
            requantize_on_merge(model.get_submodule(path), None if spec is None else spec.weight_layout)


def load_lora_weights(pipe, lora, *, adapter_name: str | None = None) -> LoraStats:
    """Pipeline-level mirror of `pipe.load_lora_weights` for a dtp-sharded `pipe.transformer`.

    The pipeline's own `lora_state_dict` converts the file (kohya, xlabs, ... -> diffusers), then
    `load_lora` loads the transformer part. A LoRA that also adapts other components (text
    encoders) raises PlanError: load those with diffusers before sharding.
    """
    state_dict, network_alphas, metadata = _pipeline_state_dict(pipe, lora)
    prefix = getattr(pipe, "transformer_name", "transformer")
    others = [k for k in state_dict if not k.startswith(f"{prefix}.")]
    if others:
        raise PlanError(
            f"LoRA key '{others[0]}' (and {len(others) - 1} more) is not under '{prefix}.'; dtp.load_lora_weights "
            f"loads the transformer part only: load text-encoder LoRAs with diffusers before sharding."
        )
    return load_lora(
        pipe.transformer,
        state_dict,
        adapter_name=adapter_name,
        prefix=prefix,
        network_alphas=network_alphas or None,
        metadata=metadata,
    )


def _pipeline_state_dict(pipe, lora) -> tuple[dict, dict | None, dict | None]:
    """(state dict, network alphas, metadata) from the pipeline's converter; signatures differ by pipeline."""
    params = inspect.signature(pipe.lora_state_dict).parameters
    if "return_alphas" in params:
        return pipe.lora_state_dict(lora, return_alphas=True, return_lora_metadata=True)
    state_dict, metadata = pipe.lora_state_dict(lora, return_lora_metadata=True)
    return state_dict, None, metadata


def _tp_mesh(model: nn.Module, specs: dict):
    """The tp mesh of the sharded bases (None when the LoRA adapts only replicated layers)."""
    for path, spec in specs.items():
        if spec is not None:
            mesh = sharded_data(base_linear(model, path)).device_mesh
            return tp_submesh(mesh) if is_fsdp(model) else mesh
    return None


def _check_peft_sizes_locally(model: nn.Module, specs: dict) -> None:
    """PlanError unless peft sizes an adapter on a sharded base from its local weight (peft 0.21 does;
    an older peft would size it from the full features and fail on the local pieces mid-load)."""
    from peft.tuners.tuners_utils import _get_in_out_features  # here: peft pulls in transformers, LoRA users only

    for path, spec in specs.items():
        if spec is not None and isinstance(base_linear(model, path).weight, DTensor):  # quantized: local_features
            linear = base_linear(model, path)
            local_out, local_in = linear.weight.to_local().shape
            if tuple(_get_in_out_features(linear)) != (local_in, local_out):
                raise PlanError(
                    f"peft {version('peft')} sizes LoRA layers on sharded '{path}' from its full features; "
                    f"dtp.load_lora needs a peft that sizes them from the local shard (>= 0.21)."
                )
            return


def _local(key: str, tensor: torch.Tensor, specs: dict, tp: int, rank: int) -> torch.Tensor:
    match = LORA_KEY.match(key)
    spec = specs[match["path"]]
    return tensor if spec is None else local_tensor(spec, match["part"], match["param"], tensor, tp, rank)


def _stats(model: nn.Module, adapter_name: str, peft_sd: dict, specs: dict, tp: int, rank: int) -> LoraStats:
    local = 0
    for path in specs:
        layer = model.get_submodule(path)
        for part in PARTS:
            for param in getattr(layer, part)[adapter_name].parameters():
                data = param.to_local() if isinstance(param, DTensor) else param
                local += data.numel() * data.element_size()
    full = sum(t.numel() * t.element_size() for t in peft_sd.values())
    sharded = sum(spec is not None for spec in specs.values())
    return LoraStats(adapter_name, rank, tp, local, full, sharded, len(specs))
