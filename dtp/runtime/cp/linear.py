"""Linear attention under CP: the sums over tokens all-reduced on the `cp` group. Installed only under CP.

Sana's `SanaLinearAttnProcessor2_0` has no softmax: per head, with ReLU kernels q = relu(Q), k = relu(K),

    scores = [V; 1] @ k^T        [d + 1, d], a sum over ALL tokens (the 1-row sums k over the tokens)
    out    = scores @ q          [d + 1, N_q], per query token
    out    = out[:d] / (out[d] + 1e-15)

Only `scores` mixes tokens, and it is a plain sum, so with the tokens split over `cp` each rank computes its
partial sum from its own keys and values, one all-reduce (fp32 sum, as the processor already computes in fp32)
gives every rank the whole sum, and the rest runs per local query unchanged: no Ulysses head split, no ring of
key blocks, the same in both cp modes and for any head count. Per attention call one all-reduce of
[B, heads / tp, d + 1, d] floats (Sana 1.6B at cp=8: 70 heads x 33 x 32 x 4 B = 296 KB per sample), whatever the
image size. The partial sums add in another order than one process's matmul: ~1e-7 relative.

Sana-Video's `SanaLinearAttnProcessor3_0` is the same idea with RoPE: scores = V K_rot^T over all tokens and the
normaliser's kernel sum of K over all tokens (z = 1 / (sum_n k_n . q + 1e-15)); both are all-reduced, in one call
(concatenated: [B, heads / tp, d, d + 1]), and RoPE rotates each rank's tokens with their own rows of the table.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...errors import ForwardError


def reduce_sums(scores: torch.Tensor, group) -> torch.Tensor:
    """The whole sequence's [V; 1] k^T from every rank's partial one: a SUM all-reduce on the cp `group`."""
    dist.all_reduce(scores, op=dist.ReduceOp.SUM, group=group)
    return scores


class SanaLinearCpAttnProcessor:
    """`SanaLinearAttnProcessor2_0` with `scores` summed over every rank's tokens (see the module docstring)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None):
        if encoder_hidden_states is not None:  # Sana's attn1 is self-attention; other keys' split is unknown here
            raise ForwardError(
                "context-parallel linear attention runs self-attention only (encoder_hidden_states=None)."
            )
        original_dtype = hidden_states.dtype
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        query = F.relu(query.transpose(1, 2).unflatten(1, (attn.heads, -1))).float()
        key = F.relu(key.transpose(1, 2).unflatten(1, (attn.heads, -1)).transpose(2, 3)).float()
        value = value.transpose(1, 2).unflatten(1, (attn.heads, -1)).float()

        value = F.pad(value, (0, 0, 0, 1), mode="constant", value=1.0)
        scores = reduce_sums(torch.matmul(value, key), self.group)  # the only step that mixes tokens
        hidden_states = torch.matmul(scores, query)

        hidden_states = hidden_states[:, :, :-1] / (hidden_states[:, :, -1:] + 1e-15)
        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2).to(original_dtype)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if original_dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return hidden_states


def _rotate(x, freqs_cos, freqs_sin):
    """SanaLinearAttnProcessor3_0's interleaved rotary embedding, unchanged."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class SanaVideoLinearCpAttnProcessor:
    """`SanaLinearAttnProcessor3_0` with its two token sums all-reduced over the cp group (module docstring)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None or rotary_emb is None:  # Sana-Video's attn1: self-attention with RoPE
            raise ForwardError("context-parallel linear attention (3_0) runs self-attention with rotary_emb only.")
        original_dtype = hidden_states.dtype
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        query, key = (F.relu(x.unflatten(2, (attn.heads, -1))) for x in (query, key))
        value = value.unflatten(2, (attn.heads, -1))
        query_rotate, key_rotate = _rotate(query, *rotary_emb), _rotate(key, *rotary_emb)
        query, key, value, query_rotate, key_rotate = (
            x.permute(0, 2, 3, 1) for x in (query, key, value, query_rotate, key_rotate)
        )  # B, H, C, N
        query_rotate, key_rotate, value = query_rotate.float(), key_rotate.float(), value.float()
        sums = torch.cat([torch.matmul(value, key_rotate.transpose(-1, -2)), key.sum(dim=-1, keepdim=True).float()], -1)
        sums = reduce_sums(sums, self.group)  # the only step that mixes tokens: both sums in one all-reduce
        scores, key_sum = sums[..., :-1], sums[..., -1:].to(key.dtype)
        z = 1 / (key_sum.transpose(-2, -1) @ query + 1e-15)
        hidden_states = torch.matmul(scores, query_rotate) * z
        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2).to(original_dtype)
        return attn.to_out[1](attn.to_out[0](hidden_states))
