"""The attention plug-in is inert outside a CP-enabled attention module's forward, and scoped to it."""

from __future__ import annotations

import sys

import pytest
import torch

from dtp import ForwardError
from dtp.runtime.cp import attention as plugin
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"


class _Recorder:
    """Stands in for CpAttention: records the call and defers to the original function."""

    def __init__(self):
        self.calls = 0

    def __call__(self, original, args):
        self.calls += 1
        return original(
            **{k: v for k, v in args.items() if k not in ("backend", "parallel_config")},
            backend=args["backend"],
            parallel_config=args["parallel_config"],
        )


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
    handles = plugin.install_attention("transformer_blocks.0.attn", model.transformer_blocks[0].attn, recorder)
    assert torch.equal(output_tensor(model(**inputs)), before)
    assert recorder.calls == 1  # only the scoped module's attention, once per forward
    assert plugin.active_attention() is None  # reset after the forward
    for handle in handles:
        handle.remove()
    model(**inputs)
    assert recorder.calls == 1


def test_attention_that_bypasses_the_dispatcher_is_an_error():
    """A scoped module whose processor never calls dispatch_attention_fn raises instead of going local."""
    model, inputs = tiny_model(FLUX), tiny_inputs(FLUX)
    attn = model.transformer_blocks[0].attn
    plugin.install_attention("transformer_blocks.0.attn", attn, _Recorder())
    original_processor = attn.processor

    class Bypass(type(original_processor)):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
            return hidden_states, encoder_hidden_states  # no attention at all

    attn.set_processor(Bypass())
    with pytest.raises(ForwardError, match="ran without calling dispatch_attention_fn"):
        model(**inputs)
    assert plugin.active_attention() is None
