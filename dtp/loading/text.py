"""What shard-on-load does differently for transformers models (the text encoders of diffusion pipelines).

A transformers model folder holds `config.json` and `model.safetensors` (or shards and
`model.safetensors.index.json`). Four things differ from a diffusers folder, each taken from
transformers itself so that the result is the model `Class.from_pretrained(folder)` builds:
  * the config: `model_class.config_class.from_pretrained(folder)`; the dtype when none is given is
    transformers 5's "auto" (`config.dtype`, else the checkpoint's floating dtype); the attention
    implementation is the one `PreTrainedModel.__init__` picks (sdpa where the class supports it);
  * tied weights: transformers saves one tensor per tie (T5's `shared.weight`, not
    `encoder.embed_tokens.weight`), so a tied key may be absent when another member of its tie is there;
  * key renames: transformers 5 maps old checkpoint names to its modules (Qwen2.5-VL's
    `model.layers.0...` -> `model.language_model.layers.0...`, Mistral 3's `language_model.model...`)
    with `conversion_mapping`. Renames are applied as transformers applies them; a conversion that
    splits or merges tensors (a `WeightConverter`) cannot be read by slices and is refused, naming the key;
  * keys transformers ignores (`_keys_to_ignore_on_load_unexpected`, e.g. T5EncoderModel's `decoder`
    keys; old persistent `position_ids`, `rotary_emb.inv_freq`) are skipped, not read.
"""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import torch
from torch import nn

from .checkpoint import CheckpointError, dtype_of
from .meta import default_dtype, parameters_on_meta

WEIGHTS_NAME = "model.safetensors"


def is_transformers_class(model_class) -> bool:
    """`model_class` is a transformers PreTrainedModel subclass (if transformers was never imported, it is not)."""
    module = sys.modules.get("transformers")
    return module is not None and isinstance(model_class, type) and issubclass(model_class, module.PreTrainedModel)


def load_text_config(model_class, directory: str):
    """The model's config from `directory`/config.json, read by the class's own config class; CheckpointError
    for a quantized checkpoint (its tensors are not the model's parameters: transformers' quantizers rebuild them)."""
    config = model_class.config_class.from_pretrained(directory)
    quantization = getattr(config, "quantization_config", None)
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else type(quantization).__name__
        raise CheckpointError(
            f"checkpoint '{directory}' is quantized ({method}); shard-on-load reads unquantized safetensors only. "
            f"Load it with transformers and dtp.parallelize it, or keep it whole (dtp run: --whole-text-encoders)."
        )
    return config


def auto_dtype(config, open_checkpoint) -> torch.dtype:
    """transformers 5's `dtype="auto"`: the config's dtype, else the first floating tensor's of the checkpoint
    (`open_checkpoint()`, called only then: its headers, no data)."""
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    floats = (dtype_of(info.dtype) for info in open_checkpoint().tensors.values())
    return next((d for d in floats if d is not None and d.is_floating_point), torch.get_default_dtype())


def build_text_on_meta(model_class, config, dtype: torch.dtype, directory: str) -> nn.Module:
    """`model_class(config)` with parameters on meta, buffers real (rotary `inv_freq` and the other
    non-persistent buffers a checkpoint does not hold), built under `dtype` as transformers builds it."""
    config.dtype = dtype
    for name in getattr(config, "sub_configs", {}):
        if getattr(config, name, None) is not None:
            getattr(config, name).dtype = dtype
    config.name_or_path = directory
    with default_dtype(dtype), parameters_on_meta():
        model = model_class(config)
    model.tie_weights()  # post_init ties already; a class that ties later is tied here, as from_pretrained does
    return model


def fp32_predicate(model: nn.Module, dtype: torch.dtype):
    """Which state-dict keys transformers keeps in float32 at `dtype` (`_keep_in_fp32_modules` under
    float16, `_keep_in_fp32_modules_strict` under float16 and bfloat16; patterns searched in the key)."""
    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    patterns = [re.compile(p.replace("*", ".*")) for p in plan]
    return lambda key: any(p.search(key) for p in patterns)


def key_renamer(model: nn.Module, expected: set[str]):
    """`rename(checkpoint_key) -> model key` as transformers 5 renames on load (its conversion mapping,
    then adding or dropping `base_model_prefix`); CheckpointError for a key a conversion splits or merges.

    Without a reachable `transformers.conversion_mapping` (older or newer internals) keys are taken as
    they are; a checkpoint in another layout then fails `match_keys`, naming the keys.
    """
    try:  # here, not at the top: `import dtp` does not import transformers (only a transformers model gets here)
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return lambda key: key
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = model.base_model_prefix
    present = dict.fromkeys(expected, True)  # transformers only asks `.get(key) is not None`

    def rename(key: str) -> str:
        renamed, converter = rename_source_key(key, renamings, converters, prefix, present)
        if renamed not in present and key in present:  # as transformers: only the prefix may change then
            renamed, converter = rename_source_key(key, [], [], prefix, present)
        if converter is not None and renamed in present:  # one the model has no use for is merely unexpected
            raise CheckpointError(
                f"checkpoint tensor '{key}' needs transformers' conversion '{converter}' -> '{renamed}' "
                f"({type(model).__name__}), which splits or merges tensors; shard-on-load reads slices of tensors "
                f"as they are stored. Load the model with transformers, save_pretrained it once, or load it whole "
                f"and use dtp.parallelize (dtp run: --whole-text-encoders)."
            )
        return renamed

    return rename


def ignored_keys(model: nn.Module, missing: set[str], unexpected: set[str]) -> tuple[set[str], set[str]]:
    """`(missing, unexpected)` less the keys transformers ignores for this class (its own rules:
    `_keys_to_ignore_on_load_missing` / `_unexpected`, old `position_ids` and `rotary_emb.inv_freq`)."""
    info = SimpleNamespace(missing_keys=set(missing), unexpected_keys=set(unexpected))
    adjust = getattr(model, "_adjust_missing_and_unexpected_keys", None)
    if adjust is not None:
        adjust(info)
    else:
        patterns = getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []
        info.unexpected_keys = {k for k in unexpected if not any(re.search(p, k) for p in patterns)}
    return info.missing_keys, info.unexpected_keys
