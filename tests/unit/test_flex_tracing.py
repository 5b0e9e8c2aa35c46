"""Flex attention (Kandinsky 6 SR's NABLA attention) under dtp's traced forward and collective counter: torch 2.13
runs it eagerly as torch.compile(fullgraph=True) of its higher-order op, which fails under either mode."""

import torch
import torch.nn.attention.flex_attention as flex

from dtp.analysis.collectives import CollectiveCounter
from dtp.analysis.tracing import TagMode, eager_flex_attention


class _NoTracer:
    def on_function(self, func, args, kwargs, out):
        pass


def _attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
    mask = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 2, 128, 128, device="cpu")
    return q, k, v, mask


@torch.no_grad()
def test_counter_and_tag_mode_run_flex_attention_as_without_them():
    """Same output as a plain call (causal block mask, 2 blocks of 64), no collective recorded, and torch's switch
    restored after each mode (both modes raised inside torch.compile before)."""
    q, k, v, mask = _attention()
    reference = flex.flex_attention(q, k, v, block_mask=mask)
    with CollectiveCounter() as counter:
        counted = flex.flex_attention(q, k, v, block_mask=mask)
    with eager_flex_attention(), TagMode(_NoTracer()):
        tagged = flex.flex_attention(q, k, v, block_mask=mask)
    assert counter.records == []
    torch.testing.assert_close(counted, reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(tagged, reference, rtol=0, atol=1e-6)
    assert flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False
