"""Routing `F.scaled_dot_product_attention` to CP attention, scoped to one attention module's forward.

Many diffusers processors (CogVideoX, Mochi, SD3's and AuraFlow's joint processors, the token refiners'
`AttnProcessor2_0`, ...) call torch's SDPA directly instead of `dispatch_attention_fn`, so the dispatcher patch
never sees them. For those, a `TorchFunctionMode` is entered by the attention module's forward pre-hook and left by
its forward hook (or by the root model's `ScopeGuard` when the forward raised); while it is active, every SDPA call
of that forward goes to the module's CP attention, and every other torch call passes through untouched. Nothing
outside the hooked module's forward is affected, and diffusers is not edited.

Layouts: torch's SDPA takes `[B, H, S, D]`; dtp's CP attention (like `dispatch_attention_fn`) takes
`[B, S, H, D]`, so q, k, v are transposed in and the output back out. The mask goes on as given
(CP attention reduces it to a per-key mask, `masks.split_mask`).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

SDPA_KERNELS = {
    "_native_flash": SDPBackend.FLASH_ATTENTION,
    "_native_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "_native_cudnn": SDPBackend.CUDNN_ATTENTION,
    "_native_math": SDPBackend.MATH,
}


def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return dict(
        query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, enable_gqa=enable_gqa,
    )  # fmt: skip


def sdpa_bshd(query, key, value, attn_mask=None, scale=None, backend=None, **unused):
    """torch SDPA on `[B, S, H, D]` tensors (the layout CP attention works in). `backend`: a diffusers backend name
    (or `AttentionBackendName`); torch's own (`_native_flash`, `_native_efficient`, `_native_cudnn`, `_native_math`)
    pin SDPA to that kernel, any other runs SDPA's default choice (a processor that calls SDPA itself never ran
    diffusers' backends)."""
    kernel = SDPA_KERNELS.get(getattr(backend, "value", backend))
    with sdpa_kernel(kernel) if kernel is not None else nullcontext():
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=attn_mask, scale=scale
        )
    return out.transpose(1, 2)


class SdpaRoute(TorchFunctionMode):
    """While active, `F.scaled_dot_product_attention(q, k, v, ...)` runs `scope.route(sdpa_bshd, args)`.

    `scope.busy` is set while CP attention itself runs (it may call SDPA on whole sequences): those
    inner calls pass through. Inside `__torch_function__` torch disables this mode, so the calls made
    while routing never re-enter it either.
    """

    def __init__(self, scope):
        super().__init__()
        self.scope = scope

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or self.scope.busy:
            return func(*args, **kwargs)
        given = _sdpa_arguments(*args, **kwargs)
        q, k, v = (given[name].transpose(1, 2) for name in ("query", "key", "value"))
        routed = {**given, "query": q, "key": k, "value": v}
        return self.scope.route(sdpa_bshd, routed).transpose(1, 2)
