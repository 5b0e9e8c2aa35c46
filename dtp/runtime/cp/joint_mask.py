"""HunyuanVideo 1.5's joint attention with its padded-prompt mask as a key mask, so CP attention reads no mask data.

`HunyuanVideo15AttnProcessor2_0` pads the text mask on the left with True to the joint [video, text] length and
passes the outer product mask x mask^T ([B, 1, S, S], bool). Per rank that is the rank's slice of the whole outer
product, but CP attention can only tell a materialised [S, S] mask is an outer product by comparing it on the device
(a host read per layer, and no answer at all on fake tensors, where `dtp check` measures the peak). The adapter
passes the same information as a key mask ([B, 1, 1, S]: masked keys get weight 0) and zeroes the rows of masked
queries afterwards, which is what attention under the outer product gives them (no visible key: output 0, as torch's
SDPA and `masks.split_mask`'s blind rows). Everything else is the processor's code, unchanged; the attention call
goes through `dispatch_attention_fn` imported here, a name CP patches as in diffusers' processor modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn  # CP patches this module's name (attention.py)
from diffusers.models.embeddings import apply_rotary_emb


def _heads(x, heads: int):
    return x.unflatten(2, (heads, -1))


class HunyuanVideo15CpAttnProcessor:
    """`HunyuanVideo15AttnProcessor2_0` with a key mask instead of the outer product (module docstring)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query = attn.norm_q(_heads(attn.to_q(hidden_states), attn.heads))
        key = attn.norm_k(_heads(attn.to_k(hidden_states), attn.heads))
        value = _heads(attn.to_v(hidden_states), attn.heads)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        if encoder_hidden_states is not None:
            encoder_query = _heads(attn.add_q_proj(encoder_hidden_states), attn.heads)
            encoder_key = _heads(attn.add_k_proj(encoder_hidden_states), attn.heads)
            encoder_value = _heads(attn.add_v_proj(encoder_hidden_states), attn.heads)
            if attn.norm_added_q is not None:
                encoder_query = attn.norm_added_q(encoder_query)
            if attn.norm_added_k is not None:
                encoder_key = attn.norm_added_k(encoder_key)
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)

        batch, length = query.shape[:2]
        valid = F.pad(attention_mask, (length - attention_mask.shape[1], 0), value=True).bool()  # [B, S]
        out = dispatch_attention_fn(
            query, key, value, attn_mask=valid.view(batch, 1, 1, length), dropout_p=0.0, is_causal=False
        )
        out = out.masked_fill(torch.logical_not(valid).view(batch, length, 1, 1), 0.0)
        hidden_states = out.flatten(2, 3).to(query.dtype)

        if encoder_hidden_states is not None:
            text = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-text], hidden_states[:, -text:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states
