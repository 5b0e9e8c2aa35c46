"""Cross-attention to a context repeated once per frame, its keys and values projected once per sample (a plan's
`cp.per_sample`, `plan.cp.CpPlan.per_sample`).

Latte's spatial blocks run on frames ([B x F, P, D]) and cross-attend to the caption, which its forward repeats once
per frame (`repeat_interleave(F, dim=0)`: [B x F, L, D], sample-major). diffusers' `AttnProcessor2_0` then projects
the keys and values of every row: [B x F, L, D] each, F identical copies per sample. Under CP every rank holds every
frame (the cut is along the patches), so each rank held those two whole tensors (16 frames of 512 caption tokens:
[8192, 1152] each, 19 MB, at cp=8 on a 0.101 GB ideal). Here the adapter takes one context row per sample (rows 0, F,
2F, ...), projects its keys and values ([B, L, D]), and lets each sample's F x P queries attend to them in one call:
[B x F, P, D] queries viewed as [B, F x P, D]; attention is per query row, so this equals F calls against F copies.

B is the batch (dim 0) of the model's input the plan names (recorded per forward, `framewise.Samples`); that the F
rows of a sample are copies is the forward's construction, not read on the device. Example: B = 2, F = 3, P = 4 local
patches, L = 8: queries [6, 4, D] -> [2, 12, D], keys / values of context rows 0 and 3: [2, 8, D].
With an attention mask (diffusers' Latte forward passes `encoder_attention_mask` through) the original processor
runs: its mask is laid out per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ForwardError
from .framewise import Samples


def one_per_sample(context: torch.Tensor, frames: int) -> torch.Tensor:
    """Rows 0, F, 2F, ... of a sample-major [B x F, L, D] context: each sample's own context, [B, L, D]."""
    return context[::frames]


class PerSampleContextProcessor:
    """`AttnProcessor2_0`'s cross-attention with the context's keys / values projected once per sample."""

    def __init__(self, original, samples: Samples, batch_of: str, path: str):
        self.original, self.samples, self.batch_of, self.path = original, samples, batch_of, path

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args, **kw):
        if encoder_hidden_states is None or attention_mask is not None or args or kw:
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kw)
        batch, (rows, tokens) = self.samples.of(self.batch_of, self.path), hidden_states.shape[:2]
        if hidden_states.ndim != 3 or rows % batch or encoder_hidden_states.shape[0] != rows:
            raise ForwardError(
                f"cp.per_sample '{self.path}': queries {tuple(hidden_states.shape)} and context "
                f"{tuple(encoder_hidden_states.shape)} are not [B x F, ., D] rows of {batch} samples."
            )
        context = one_per_sample(encoder_hidden_states, rows // batch)
        if attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch, -1, attn.heads, head_dim).transpose(1, 2)  # [B, H, F x P, hd]: a sample's frames
        key = key.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
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


def install_per_sample(model: nn.Module, sites) -> list:
    """For every `(attention path, model input)` of `cp.per_sample`: swap in the adapter; returns the handles."""
    if not sites:
        return []
    samples = Samples(model, [batch_of for _, batch_of in sites])
    handles = [model.register_forward_pre_hook(samples.record, with_kwargs=True)]
    for path, batch_of in sites:
        attn = model.get_submodule(path)
        handles.append(_Processor(attn, attn.processor))
        attn.processor = PerSampleContextProcessor(attn.processor, samples, batch_of, path)
    return handles


class _Processor:
    """A hook-handle look-alike: `remove()` puts the original processor back."""

    def __init__(self, attn: nn.Module, processor):
        self.attn, self.processor = attn, processor

    def remove(self) -> None:
        self.attn.processor = self.processor
