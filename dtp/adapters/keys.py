"""A diffusers LoRA read the way diffusers reads it, grouped by target module, checked against the model.

Reading and format conversion are diffusers' own (`_fetch_state_dict` for files and folders,
`convert_unet_state_dict_to_peft` for the old `lora.down`/`lora.up` names, the pipelines'
`lora_state_dict` converters upstream of `load_lora`); this module only applies the same prefix
rule as `load_lora_adapter` so that it sees the keys peft will see, then checks them:

    {path}.lora_A.weight  [r, in_features]     {path}.lora_B.weight  [out_features, r]
    {path}.lora_B.bias    [out_features]       (peft's `lora_bias=True`, rare)

`in_features`/`out_features` are the base Linear's full sizes (sharding leaves those attributes
alone), so the check reads the same on a sharded model as on the original one. Example: FLUX.1's
`transformer_blocks.0.attn.to_q` (3072 -> 3072) with a rank-16 LoRA wants A [16, 3072], B [3072, 16].
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import PlanError

LORA_KEY = re.compile(r"^(?P<path>.+)\.(?P<part>lora_A|lora_B)\.(?P<param>weight|bias)$")


@dataclass(frozen=True)
class LoraTarget:
    """One module a LoRA adapts: its path in the model and the adapter's rank there."""

    path: str
    rank: int


def read_lora(lora) -> tuple[dict[str, torch.Tensor], dict | None]:
    """(state dict, diffusers adapter metadata or None) from a state dict, a LoRA file or a folder holding one."""
    if isinstance(lora, dict):
        return dict(lora), None
    # diffusers' loaders pull in peft and transformers (seconds): imported here, for LoRA users only.
    from diffusers.loaders.lora_base import _fetch_state_dict

    state_dict, metadata = _fetch_state_dict(
        pretrained_model_name_or_path_or_dict=str(lora),
        weight_name=None,
        use_safetensors=None,
        local_files_only=True,
        cache_dir=None,
        force_download=False,
        proxies=None,
        token=None,
        revision=None,
        subfolder=None,
        user_agent={"file_type": "attn_procs_weights", "framework": "pytorch"},
        allow_pickle=False,
    )
    return state_dict, metadata


def peft_view(state_dict: dict[str, torch.Tensor], prefix: str | None) -> dict[str, torch.Tensor]:
    """The keys `load_lora_adapter` hands to peft: `prefix.` removed (others dropped), peft's A/B names."""
    if prefix:
        state_dict = {k.removeprefix(f"{prefix}."): v for k, v in state_dict.items() if k.startswith(f"{prefix}.")}
    if state_dict and "lora_A" not in next(iter(state_dict)):
        from diffusers.utils.state_dict_utils import convert_unet_state_dict_to_peft

        state_dict = convert_unet_state_dict_to_peft(state_dict)  # the same first-key test diffusers makes
    return state_dict


def base_linear(model: nn.Module, path: str) -> nn.Module | None:
    """The module at `path` (the base layer when peft already wrapped it), or None when there is none."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    return module.get_base_layer() if hasattr(module, "get_base_layer") else module


def check_lora(model: nn.Module, peft_sd: dict[str, torch.Tensor], adapter_name: str, prefix) -> list[LoraTarget]:
    """Every module the LoRA adapts, with its rank; PlanError (model untouched) for anything that does not fit."""
    if not peft_sd:
        raise PlanError(f"the LoRA holds no keys under prefix '{prefix}'; pass the prefix its keys start with.")
    if adapter_name in getattr(model, "peft_config", {}):
        raise PlanError(f"adapter name '{adapter_name}' is already loaded; delete it first or choose another name.")
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in peft_sd.items():
        match = LORA_KEY.match(key)
        if match is None:
            raise PlanError(
                f"LoRA key '{key}' is not a plain LoRA tensor ('<module>.lora_A.weight', '.lora_B.weight', "
                f"'.lora_B.bias'); dtp loads plain LoRA only (no DoRA magnitudes, LoKr or other adapters)."
            )
        parts.setdefault(match["path"], {})[f"{match['part']}.{match['param']}"] = tensor
    return [_check_module(model, path, found, prefix) for path, found in parts.items()]


def _check_module(model: nn.Module, path: str, found: dict[str, torch.Tensor], prefix) -> LoraTarget:
    key = f"{prefix}.{path}" if prefix else path
    linear = base_linear(model, path)
    if linear is None:
        raise PlanError(f"LoRA key '{key}.lora_A.weight': the model ({type(model).__name__}) has no module '{path}'.")
    if not isinstance(linear, nn.Linear):
        raise PlanError(f"LoRA key '{key}': '{path}' is a {type(linear).__name__}; dtp adapts nn.Linear layers only.")
    if "lora_A.weight" not in found or "lora_B.weight" not in found:
        raise PlanError(f"LoRA key '{key}': needs both lora_A.weight and lora_B.weight, found {sorted(found)}.")
    a = found["lora_A.weight"]
    if a.dim() != 2:
        raise PlanError(f"LoRA key '{key}.lora_A.weight' has shape {list(a.shape)}; a LoRA factor is 2-D [rank, in].")
    rank = a.shape[0]
    expected = {
        "lora_A.weight": (rank, linear.in_features),
        "lora_B.weight": (linear.out_features, rank),
        "lora_B.bias": (linear.out_features,),
    }
    for name, tensor in found.items():
        if tuple(tensor.shape) != expected[name]:
            raise PlanError(
                f"LoRA key '{key}.{name}' has shape {list(tensor.shape)}, but '{path}' is a Linear "
                f"{linear.in_features} -> {linear.out_features} and lora_A has rank {rank}: expected "
                f"{list(expected[name])} (A is [rank, in_features], B is [out_features, rank])."
            )
    return LoraTarget(path, rank)
