"""The attention backend a sharded model runs: set once on the model, read by Ulysses and ring attention.

`dtp.parallelize(..., attention_backend="cudnn")` (and `from_pretrained`, `parallelize_pipeline`,
`load_pipeline`) takes a name of `choices.ATTENTION_BACKENDS`; `policy.check_attention_backend` turns it into
diffusers' name during `prepare` (a PlanError before anything changes: unknown, package missing, or one ring
cannot run). `apply` then calls diffusers' `ModelMixin.set_attention_backend` on a model that has it, so every
processor that calls `dispatch_attention_fn` (FLUX, Wan, Qwen-Image, ... and Ulysses' attention on whole
sequences) runs that kernel; CP attention gets the same name (`CpAttention.backend`): Ulysses passes it where a
processor names none, ring runs its blocks in that backend's kernel family (`runtime/cp/kernels.py`).
diffusers keeps the choice per processor and also as its process-wide active backend; dtp restores the latter, so
another model in the same process (or a later test) keeps its own default.
"""

from __future__ import annotations

from torch import nn


def set_attention_backend(model: nn.Module, backend: str | None) -> None:
    """diffusers' `set_attention_backend(backend)` on `model` when it has it; None (auto) leaves it as it is."""
    if backend is None or not hasattr(model, "set_attention_backend"):
        return
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    active = _AttentionBackendRegistry.get_active_backend()
    try:
        model.set_attention_backend(backend)
    finally:
        _AttentionBackendRegistry.set_active_backend(active[0] if isinstance(active, tuple) else active)
