"""Qwen-Image 2.1's block-causal attention under Ulysses: one call with the mask over the whole sequence.

`QwenImage21AttnProcessor` runs its prefill as one attention call per prefix segment, slicing the
queries at the segments' global positions (`query[:, start:end]`); under CP each rank holds a chunk of
the sequence, so those slices would be wrong. Its mask is `(q_idx >= kv_idx) or same image block`
(diffusers' `build_qwenimage21_block_causal_mask`): text queries are causal, image queries see every
key up to the end of their own image block, the target image sees everything; padded prompt keys
(`key_valid`) are dropped for every query. That mask differs per query, so it is no key mask, but Ulysses
gives each rank every token for its heads: the adapter projects the local chunk with diffusers' own code
(`_qwenimage21_prepare_qkv`: q/k/v, QK-norm, RoPE of the local positions) and makes ONE attention call
with the `[B|1, 1, S, S]` bool mask of the whole sequence (through torch SDPA, routed by `sdpa.py`), which
CP attention applies whole after its all-to-all (`masks.whole_mask`). Example: segments
[(0, 3, text), (3, 7, image)], S = 10: query 1 sees keys 0..1, query 5 keys 0..6, query 8 keys 0..9.

A joint sequence cp does not divide is zero-padded at its end (the plan's `pad`, `PadState`): the adapter extends
`key_valid` with False for the pad keys, so the mask stays exact; the pad queries' rows are dropped at the gather.

Ring attention only ever holds one key block: the plan refuses it (`ring_refused`). The KV-cache modes
(extract / cached, a multi-turn edit feature) are refused under CP: the cache would hold local keys.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...errors import ForwardError


def block_causal_mask(segments, key_valid: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """`[B|1, 1, length, length]` bool, True = attend: the structure of `QwenImage21AttnProcessor`'s prefill.

    segments: `(start, end, is_text)` runs covering `[0, prefix_len)`; positions from `prefix_len` on are
    the target image. A query in a segment sees keys `< end`, and a text query only keys `<= itself`.
    """
    end = torch.full((length,), length, dtype=torch.long, device=device)
    text = torch.zeros(length, dtype=torch.bool, device=device)
    for start, stop, is_text in segments:
        end[start:stop] = stop
        text[start:stop] = is_text
    positions = torch.arange(length, device=device)
    keys, queries = positions[None, :], positions[:, None]
    mask = (keys < end[:, None]) & (~text[:, None] | (keys <= queries))
    mask = mask[None, None]
    return mask if key_valid is None else mask & key_valid.bool()[:, None, None, :]


class QwenImage21CpAttnProcessor:
    """QwenImage21AttnProcessor's prefill as one Ulysses call over the whole sequence (module docstring)."""

    def __init__(self, attention):
        self.group = attention.group  # the `cp` process group: the whole sequence is cp x the local chunk
        self.pads = getattr(attention, "pads", None)  # hooks.PadState when the joint sequence is padded to cp

    def __call__(
        self,
        attn,
        hidden_states,
        attention_mask=None,
        rotary_emb=None,
        layer_cache=None,
        kv_cache_mode=None,
        cache_write_slice=None,
        segments=None,
        key_valid=None,
    ):
        # diffusers' own projection, norm and RoPE; imported here so that `import dtp` does not load the model file.
        from diffusers.models.transformers import transformer_qwenimage21 as qwen

        if layer_cache is not None or segments is None:
            raise ForwardError(
                "Qwen-Image 2.1 under context parallelism runs the prefill only (no kv_cache / kv_cache_mode): the "
                "cache would hold this rank's keys; use cp=1 for cached decoding."
            )
        query, key, value, _ = qwen._qwenimage21_prepare_qkv(attn, hidden_states, rotary_emb, None, None, None)
        length = query.shape[1] * dist.get_world_size(self.group)
        mask = block_causal_mask(segments, self._padded_key_valid(key_valid, length, query), length, query.device)
        # torch SDPA (what diffusers' native backend calls), so the SDPA route hands it to CP attention
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))

    def _padded_key_valid(self, key_valid, length: int, query):
        """`key_valid` over the padded sequence (`PadState`: the joint tokens zero-padded at the end to a multiple of
        cp): the pad keys False, so no query sees them; unchanged when nothing is padded. 27 tokens, cp = 2: 28 keys,
        key 27 masked."""
        slot = None if self.pads is None else self.pads.slots["last"]
        if slot is None or not slot.padded or slot.total == length:
            return key_valid
        if slot.local * dist.get_world_size(self.group) != length:
            raise ForwardError(f"cp padding: {length} keys are not the padded joint sequence of {slot.total} tokens.")
        if key_valid is None:
            key_valid = torch.ones(query.shape[0], slot.total, dtype=torch.bool, device=query.device)
        return F.pad(key_valid.bool(), (0, length - slot.total), value=False)
