"""Cross-attention to a context the forward repeats once per frame, its keys and values projected once per sample (a
plan's `cp.per_sample`, `plan.cp.CpPlan.per_sample`).

Latte's spatial blocks run on frames ([B x F, P, D]) and cross-attend to the caption, which its forward projects
(`caption_projection`, [B, L, D]) and repeats once per frame (`repeat_interleave(F, dim=0)`: [B x F, L, D],
sample-major); diffusers' `AttnProcessor2_0` then projects the keys and values of every row, F identical copies per
sample. Under CP every rank holds every frame (the cut is along the patches), so each rank held three whole tensors
(16 frames of 512 caption tokens: the repeated caption, its keys and its values, [8192, 1152] each, 19 MB, at cp=8
on a 0.101 GB ideal). Here:

1. The context module (`caption_projection`) keeps its [B, L, D] output and hands the forward int64 zeros [B, L, 1]
   (`grid_embed.zero_table`): the forward's repeat makes [B x F, L, 1] of them, not of the caption.
2. The adapter (the cross-attention's processor) projects the kept context's keys and values once ([B, L, D]) and
   lets each sample's F x P queries attend to them in one call: [B x F, P, D] viewed as [B, F x P, D]
   (`by_sample`); attention is per query row, so this equals F calls against F copies.

B is the kept context's dim 0; the queries' rows are B x F, sample-major, as the forward's repeat made the context's
(its construction, not read on the device). Example: B = 2, F = 3, P = 4 local patches, L = 8: queries [6, 4, D] ->
[2, 12, D], keys / values [2, 8, D]. With an attention mask (the forward passes `encoder_attention_mask` through),
the original processor runs on the repeated context, rebuilt whole from the kept one: its mask is laid out per row.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ForwardError
from .grid_embed import zero_table
from .local_embed import Restore


def by_sample(x: torch.Tensor, batch: int) -> torch.Tensor:
    """Sample-major rows [B x F, P, C] -> [B, F x P, C]: each sample's frames as one longer sequence."""
    return x.view(batch, -1, x.shape[-1])


class ContextState:
    """The context module's [B, L, D] output of this forward (`table`, the name `zero_table` writes)."""

    def __init__(self):
        self.reset()

    def reset(self, *unused) -> None:
        self.table = None


class PerSampleContextProcessor:
    """`AttnProcessor2_0`'s cross-attention with the kept context's keys / values projected once per sample."""

    def __init__(self, original, state: ContextState, path: str, context: str):
        self.original, self.state, self.path, self.context = original, state, path, context

    def _frames(self, stand_in, rows: int) -> int:
        context = self.state.table
        if context is None:
            raise ForwardError(f"cp.per_sample '{self.path}': '{self.context}' did not run in this forward.")
        shape = (rows, context.shape[1], 1)
        if not (isinstance(stand_in, torch.Tensor) and stand_in.dtype == torch.int64 and stand_in.shape == shape):
            got = tuple(stand_in.shape) if isinstance(stand_in, torch.Tensor) else type(stand_in).__name__
            raise ForwardError(
                f"cp.per_sample '{self.path}': the context must be '{self.context}''s int64 stand-in repeated per "
                f"frame, {shape}, got {got}: the forward computes on the context before this attention."
            )
        if rows % context.shape[0]:
            raise ForwardError(
                f"cp.per_sample '{self.path}': {rows} rows are not frames of {context.shape[0]} samples."
            )
        return rows // context.shape[0]

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args, **kw):
        rows, tokens = hidden_states.shape[:2]
        frames, context = self._frames(encoder_hidden_states, rows), self.state.table
        if attention_mask is not None or args or kw or hidden_states.ndim != 3:
            whole = context.repeat_interleave(frames, dim=0)  # as the forward built it: the processor's own math
            return self.original(attn, hidden_states, whole, attention_mask, temb, *args, **kw)
        if attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        batch, head_dim = context.shape[0], key.shape[-1] // attn.heads
        query = by_sample(query, batch).unflatten(2, (attn.heads, head_dim)).transpose(1, 2)  # [B, H, F x P, hd]
        key = key.unflatten(2, (attn.heads, head_dim)).transpose(1, 2)
        value = value.unflatten(2, (attn.heads, head_dim)).transpose(1, 2)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(rows, tokens, attn.heads * head_dim).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        if attn.residual_connection:
            out = out + hidden_states
        return out / attn.rescale_output_factor


class _Processor:
    """A hook-handle look-alike: `remove()` puts the original processor back."""

    def __init__(self, attn: nn.Module, processor):
        self.attn, self.processor = attn, processor

    def remove(self) -> None:
        self.attn.processor = self.processor


def install_per_sample(model: nn.Module, sites) -> list:
    """For every `(attention path, context module path)` of `cp.per_sample`: the context module keeps its output
    and returns the stand-in, the attention's processor is the adapter. Returns the handles."""
    handles, states = [], {}
    for path, context_path in sites:
        if context_path not in states:
            state = states[context_path] = ContextState()
            handles.append(model.register_forward_pre_hook(state.reset))
            handles.append(model.register_forward_hook(state.reset, always_call=True))
            module = model.get_submodule(context_path)
            module.forward = types.MethodType(zero_table(state, type(module).forward), module)
            handles.append(Restore(module))
        attn = model.get_submodule(path)
        handles.append(_Processor(attn, attn.processor))
        attn.processor = PerSampleContextProcessor(attn.processor, states[context_path], path, context_path)
    return handles
