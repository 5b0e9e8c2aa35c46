"""The state a diffusers step cache keeps on one rank between transformer calls, for `dtp fit --cache NAME`.

It lives from the first transformer call until the pipeline call ends (diffusers frees it in
`maybe_free_model_hooks`, after the VAE decode), so it adds to the denoise and decode phases' peaks:

    taylorseer  per hooked module (diffusers' default patterns, `re.fullmatch`: each block's `attn`), per cache
                context, max_order + 1 = 2 Taylor factors of each output, in bf16 (TaylorSeerCacheConfig defaults)
    pab         one output per hooked attention (the blocks' self-attentions), shared by the contexts, model dtype

Output sizes are measured: the fit's full-size transformer on the meta device (one block per list) runs its
full-size inputs (one row) with forward hooks on those modules; a block list's bytes count its length times
(`scale_blocks`). On a rank: x rows (the cfg batch path's share), / cp (an attention's output holds the rank's
tokens), whole under tp (the output projection's all-reduce). Contexts: the pipeline's calls per step (two-call
CFG keeps a "cond" and an "uncond" state; at cfg=2 both groups run both calls at step 0, so both stay on every
rank). Example, FLUX.1-dev at 1024² in bf16, one call per step: 57 attentions x 4608 tokens x 3072 x 2 bytes x 2
factors = 3.2 GB for TaylorSeer (6.4 GB with a second context: true CFG).
"""

from __future__ import annotations

import re
from collections import Counter
from functools import partial

import torch

from ..analysis.trace import scale_blocks
from ..choices import FIT_CACHE_NAMES
from ..errors import PlanError

CACHE_STATE_NAMES = FIT_CACHE_NAMES
CACHE_PHASES = ("denoise", "decode")  # the phases the state lives through
TAYLOR_FACTORS, TAYLOR_BYTES = 2, 2  # TaylorSeerCacheConfig: max_order 1 -> 2 factors, taylor_factors_dtype bf16


def state_bytes(name: str, measurer, shape, *, cp: int = 1, rows: int = 1, contexts: int = 1) -> int:
    """Bytes of the cache `name`'s state on one rank (module docstring); PlanError for a cache without a model."""
    if name not in CACHE_STATE_NAMES:
        raise PlanError(
            f"dtp fit --cache {name}: no state model for this cache; known: {', '.join(CACHE_STATE_NAMES)} (fbc and "
            "mag keep a few hidden-state-sized tensors per branch, see docs/cache.md)."
        )
    module, lengths, call = measurer.transformer_call(shape)
    outputs = _hooked_output_numel(module, lengths, call, _patterns(name))
    elements = sum(scale_blocks(outputs, lengths).values()) * rows // cp
    if name == "taylorseer":
        return elements * TAYLOR_FACTORS * TAYLOR_BYTES * contexts
    return elements * measurer.dtype.itemsize


class CacheState:
    """`state_bytes` of one cache, pipeline, shape and context count, per (cp, rows), each measured once."""

    def __init__(self, name: str, measurer, shape, contexts: int):
        state_bytes(name, measurer, shape, contexts=contexts)  # a PlanError for an unknown name before any row
        self.name, self._args, self._memo = name, (measurer, shape, contexts), {}

    def bytes(self, cp: int, rows: int) -> int:
        if (cp, rows) not in self._memo:
            measurer, shape, contexts = self._args
            self._memo[(cp, rows)] = state_bytes(self.name, measurer, shape, cp=cp, rows=rows, contexts=contexts)
        return self._memo[(cp, rows)]


def _patterns(name: str):
    """diffusers' own module patterns for the cache `name`: (regexes, match function)."""
    if name == "taylorseer":
        from diffusers.hooks.taylorseer_cache import _TRANSFORMER_BLOCK_IDENTIFIERS

        return _TRANSFORMER_BLOCK_IDENTIFIERS, re.fullmatch
    from diffusers.hooks.pyramid_attention_broadcast import PyramidAttentionBroadcastConfig

    return PyramidAttentionBroadcastConfig().spatial_attention_block_identifiers, re.search


def _hooked_output_numel(module, lengths: dict, call, patterns) -> Counter:
    """Elements of the outputs of the modules matching `patterns`, by block scope, on one forward of `call`."""
    from diffusers.models.attention import AttentionModuleMixin

    regexes, match = patterns
    found, handles = Counter(), []
    for path, sub in module.named_modules():
        if any(match(r, path) for r in regexes) and (
            match is re.fullmatch or _self_attention(sub, AttentionModuleMixin)
        ):
            handles.append(sub.register_forward_hook(partial(_count, found, _scope(path, lengths))))
    try:
        with torch.no_grad():
            call.run(module, **call.kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return found


def _self_attention(module, mixin) -> bool:
    """PAB hooks attention modules that are not cross-attention (pyramid_attention_broadcast.py)."""
    return isinstance(module, mixin) and not getattr(module, "is_cross_attention", False)


def _scope(path: str, lengths: dict) -> str:
    """The block scope (`transformer_blocks.0`) of a module path, "" outside the block lists; `lengths` keyed by list
    paths or by the kept blocks' own scopes (`kinds.cut_by_kind`)."""
    for key in lengths:
        if path.startswith(f"{key}."):
            own = key.rpartition(".")[2].isdigit()  # a block's scope, not a list's
            return key if own else ".".join(path.split(".")[: key.count(".") + 2])
    return ""


def _count(found: Counter, scope: str, module, args, output) -> None:
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    found[scope] += sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))
