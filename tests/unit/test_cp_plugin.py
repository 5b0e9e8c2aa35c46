"""The attention plug-in is inert outside a CP-enabled attention module's forward, and scoped to it."""

from __future__ import annotations

import sys

import torch

from dtp.cp import attention as plugin
from dtp.tiny import output_tensor, tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"


class _Recorder:
    """Stands in for CpAttention: records the call and defers to the original function."""

    def __init__(self):
        self.calls = 0

    def __call__(self, original, args):
        self.calls += 1
        return original(**{k: v for k, v in args.items() if k not in ("backend", "parallel_config")},
                        backend=args["backend"], parallel_config=args["parallel_config"])


@torch.no_grad()
def test_patched_dispatch_is_inert_without_scope_and_active_inside_it():
    """Patching leaves an unhooked model bit-identical; a scoped module routes its attention to CP."""
    model, inputs = tiny_model(FLUX), tiny_inputs(FLUX)
    before = output_tensor(model(**inputs))
    module = sys.modules[type(model.transformer_blocks[0].attn.processor).__module__]
    plugin.patch_dispatch(module)
    plugin.patch_dispatch(module)  # idempotent: wraps once
    assert not hasattr(module.dispatch_attention_fn._dtp_cp_original, "_dtp_cp_original")
    assert torch.equal(output_tensor(model(**inputs)), before)

    recorder = _Recorder()
    attn = model.transformer_blocks[0].attn
    scope = plugin._Scope(recorder)
    handles = [attn.register_forward_pre_hook(scope.enter), attn.register_forward_hook(scope.exit, always_call=True)]
    assert torch.equal(output_tensor(model(**inputs)), before)
    assert recorder.calls == 1  # only the scoped module's attention, once per forward
    assert plugin._ACTIVE.get() is None  # reset after the forward
    for handle in handles:
        handle.remove()
    model(**inputs)
    assert recorder.calls == 1
