"""Cosmos 3 Omni's dual-pathway packed attention under CP: a causal text prefix and generation tokens that attend to
both, each pathway cut on its own (the scheme diffusers' own Cosmos 3 CP helper uses, run on dtp's collectives).

`Cosmos3AttnProcessor` gets one unbatched packed sequence split at `und_len`: the understanding (text) tokens
attend causally among themselves (`is_causal=True`), the generation tokens (video, sound, action) attend to
cat(understanding keys, generation keys) with no mask; both with grouped-query heads (`enable_gqa`). diffusers leaves
CP to external seams: `_cp_shard_fn(und_seq, gen_seq, rotary_emb)` before the decoder layers and
`_cp_gather_fn(und_out, gen_out)` after the final norms, plus a CP processor (its `examples/cosmos3/cosmos_parallel.py`:
each pathway zero-padded to a multiple of cp and cut contiguously with its own RoPE rows; Ulysses over both
pathways; the generation queries' pad keys masked; each pathway gathered and unpadded). dtp makes the same cut
before the forward's packing (`plans/cosmos3_omni.yaml`, `cp.forward: cosmos3_omni`, `runtime/cp/cosmos3.py`: each
rank packs its own rows of `und_seq` / `gen_seq` and their RoPE tables, padded `first` / `last`, and gathers only
`proj_out`'s output) and swaps in `PackedCpAttnProcessor`, which runs the same projections, norms and RoPE, then:

- Ulysses: one all-to-all per pathway's queries and one for its stacked keys / values, so every rank holds whole
  sequences for its heads (kv heads are repeated in contiguous groups when the rank's kv head count does not divide
  by cp: query head i keeps its kv group), then the kv heads are repeated up to the query heads (SDPA with
  `enable_gqa` takes the math kernel on CUDA). The understanding tokens are in global order, their pad at the end:
  `is_causal` over them is exact (no real query sees a later pad key). The generation queries attend to
  [understanding | generation] keys with the pad keys of both masked.
- Ring: the kv heads travel the ring unexpanded and are repeated up to the query heads per step, on the block being
  computed only (`ring.block_attention`'s kv_groups; the diagonal causal block folds the groups into its einsum), so
  the rank's K/V and every chunk in flight are H / Hkv (4 in Cosmos 3) times smaller than expanded ones. The causal
  pathway runs a block-causal ring: the key block of rank s is seen whole by the queries of rank r > s, causally on
  the diagonal (s = r), not at all for s > r (it still travels on); the pad keys sit at the end of the last rank's
  block, after every real query. The generation queries run dtp's ring attention over each rank's
  [understanding_r | generation_r] keys with the pad keys masked.

Exact up to float rounding: softmax does not depend on the order of keys, every key keeps its RoPE phase (computed on
the whole sequence before the cut), and each query's output returns to its rank.
Example: 7 text + 16 video tokens, cp = 2: text padded to 8 (4 a rank, rank 1: 3 real), video 8 a rank; rank 1's
generation keys [t4 t5 t6 pad | v8 .. v15]; under Ulysses every rank attends [t0 .. t6 pad v0 .. v15], pad masked.
"""

from __future__ import annotations

import math

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn

from ...errors import ForwardError
from ...policy import ring_kernel_family
from ...styles.collectives import send_to_next, wait_for
from .ring import block_attention, kv_groups_of, merge, ring_attention
from .ulysses import heads_to_seq, stacked_to_heads


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """`[B, S, Hkv, D]` -> `[B, S, Hkv * times, D]`, each kv head repeated `times` times in a row (query head i of
    H pairs with kv head i // (H / Hkv) before and after)."""
    return x if times == 1 else x.repeat_interleave(times, dim=2)


def causal_block(q, k, v, scale: float):
    """Causal attention of a rank's queries over its own keys (the ring's diagonal block), in fp32 math:
    `(out [B, S, H, D], lse [B, H, S])` for `ring.merge`. k / v may have fewer heads than q (grouped-query: query head
    i reads kv head i // (H / Hkv)); the groups are folded into the einsum, never expanded. The understanding pathway
    is the text prompt (hundreds of tokens a rank), so the [S, S] scores are small."""
    b, rows, heads, dim = q.shape
    kv_heads = k.shape[2]
    qg = q.float().reshape(b, rows, kv_heads, heads // kv_heads, dim)  # [B, S, Hkv, G, D]: contiguous groups
    scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, k.float()) * scale
    future = torch.ones(rows, k.shape[1], dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, Hkv, G, S]
    out = torch.einsum("bhgqk,bkhd->bqhgd", torch.exp(scores - lse.unsqueeze(-1)), v.float())
    return out.flatten(2, 3), lse.flatten(1, 2)


def sees_whole(source: int, rank: int) -> bool:
    """Whether the queries of cp rank `rank` see every key of rank `source`'s block: the block lies before theirs in
    the causal prefix (contiguous chunks in rank order; the diagonal block is causal, later ones unseen)."""
    return source < rank


def ring_causal(query, key, value, *, group, scale: float, backend: str | None = None) -> torch.Tensor:
    """Causal attention over the whole cp-split sequence (rank r holds global rows [r c, (r + 1) c)), keys travelling
    round the ring as in `ring.ring_attention`: block s is seen whole by rank r > s, causally by rank s, not by
    rank r < s. `[B, S/cp, H, D]` in and out; key / value may have fewer heads (a divisor of H, grouped-query): they
    travel with their own heads and are expanded per block (`block_attention`'s kv_groups)."""
    cp, rank = group.size(), group.rank()
    groups = kv_groups_of(query.shape[2], key.shape[2], enable_gqa=True)
    d_k, d_v = key.shape[-1], value.shape[-1]
    kv = torch.cat([key, value], dim=-1)
    out, lse = causal_block(query, key, value, scale)
    for step in range(1, cp):
        kv = wait_for(send_to_next(kv, group))
        source = (rank - step) % cp
        if sees_whole(source, rank):
            k, v = kv.narrow(-1, 0, d_k), kv.narrow(-1, d_k, d_v)
            block = block_attention(query, k, v, None, scale, backend=backend, kv_groups=groups)
            out, lse = merge(out, lse, *block)
    return out.to(query.dtype)


class PackedCpAttnProcessor:
    """`Cosmos3AttnProcessor` (diffusers 0.42.1) with its two attention calls run over the cp group (see the module
    docstring). `attention`: the module's `CpAttention` (its group, mode, backend, and the `PadState` of this forward
    whose `first` slot is the understanding pathway and `last` the generation pathway)."""

    def __init__(self, attention):
        if attention.mode not in ("ulysses", "ring"):
            raise ForwardError(
                f"Cosmos 3's packed attention runs cp_mode 'ulysses' or 'ring', not {attention.mode!r} (no Ulysses x "
                f"ring mesh); build the mesh without `ulysses=`."
            )
        self.attention = attention

    def __call__(self, attn, und_seq, gen_seq, rotary_emb):
        heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        q_und = attn.norm_q(attn.to_q(und_seq).view(-1, heads, head_dim))
        k_und = attn.norm_k(attn.to_k(und_seq).view(-1, kv_heads, head_dim))
        v_und = attn.to_v(und_seq).view(-1, kv_heads, head_dim)
        q_gen = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, head_dim))
        k_gen = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv_heads, head_dim))
        v_gen = attn.add_v_proj(gen_seq).view(-1, kv_heads, head_dim)
        k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und

        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        q_und, k_und = _rope(q_und, cos_und, sin_und), _rope(k_und, cos_und, sin_und)
        k_und_for_gen = _rope(k_und_for_gen, cos_und, sin_und)
        q_gen, k_gen = _rope(q_gen, cos_gen, sin_gen), _rope(k_gen, cos_gen, sin_gen)

        batched = [t.unsqueeze(0) for t in (q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen)]
        run = self._ulysses if self.attention.mode == "ulysses" else self._ring
        causal_out, full_out = run(*batched, scale=head_dim**-0.5)
        return attn.to_out(causal_out.squeeze(0).flatten(-2, -1)), attn.to_add_out(full_out.squeeze(0).flatten(-2, -1))

    def _key_valid(self, keys: int, device) -> torch.Tensor | None:
        """This rank's `[1, keys]` validity of its [understanding_r | generation_r] keys (pad keys False), or None."""
        pads = self.attention.pads
        return None if pads is None else pads.key_valid(keys, 1, device)

    def _ulysses(self, q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen, scale: float):
        group = self.attention.group
        cp, heads, kv_heads = group.size(), q_und.shape[2], k_und.shape[2]
        if heads % cp:
            raise ForwardError(
                f"Cosmos 3 under Ulysses: {heads} query heads per rank (after tp) do not divide by cp={cp}; use "
                f"cp_mode='ring' or a cp dividing {heads}."
            )
        shared = k_und_for_gen is k_und
        times = cp // math.gcd(kv_heads, cp)  # kv heads a multiple of cp, each query head keeping its kv group
        k_und, v_und, k_gen, v_gen = (repeat_kv(t, times) for t in (k_und, v_und, k_gen, v_gen))
        k_und_for_gen = k_und if shared else repeat_kv(k_und_for_gen, times)
        (q_und,) = stacked_to_heads((q_und,), group)
        (q_gen,) = stacked_to_heads((q_gen,), group)
        und_kv = stacked_to_heads((k_und, v_und) if shared else (k_und, v_und, k_und_for_gen), group)
        k_und, v_und = und_kv[0], und_kv[1]
        k_und_for_gen = k_und if shared else und_kv[2]
        k_gen, v_gen = stacked_to_heads((k_gen, v_gen), group)
        # The kv heads exchanged as they are, then repeated up to the query heads on whole sequences: SDPA with
        # `enable_gqa` falls back to the math kernel on CUDA ([S, S] scores), as diffusers' own Cosmos 3 helper notes.
        local = q_und.shape[2] // k_und.shape[2]
        k_und, v_und, k_und_for_gen, k_gen, v_gen = (
            repeat_kv(t, local) for t in (k_und, v_und, k_und_for_gen, k_gen, v_gen)
        )

        backend = self.attention.backend
        causal = dispatch_attention_fn(q_und, k_und, v_und, is_causal=True, scale=scale, backend=backend)
        mask = self._whole_key_valid(k_und.shape[1], k_gen.shape[1], q_gen.device)
        full = dispatch_attention_fn(
            q_gen, torch.cat([k_und_for_gen, k_gen], dim=1), torch.cat([v_und, v_gen], dim=1),
            attn_mask=mask, scale=scale, backend=backend,
        )  # fmt: skip
        return heads_to_seq(causal, group), heads_to_seq(full, group)

    def _whole_key_valid(self, und: int, gen: int, device) -> torch.Tensor | None:
        """`[1, 1, 1, und + gen]` bool over the whole padded [understanding | generation] keys, pad keys False; None
        when neither pathway is padded."""
        pads = self.attention.pads
        if pads is None or not pads.padded:
            return None
        first, last = pads.slots["first"], pads.slots["last"]
        position = torch.arange(und + gen, device=device)
        und_real = first.total if first.padded else und
        gen_real = last.total if last.padded else gen
        valid = (position < und_real) | ((position >= und) & (position < und + gen_real))
        return valid.view(1, 1, 1, -1)

    def _ring(self, q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen, scale: float):
        # The kv heads travel the ring as they are (grouped-query, 4x fewer than the query heads in Cosmos 3) and are
        # expanded per step, on the block being computed only (`ring.block_attention`'s kv_groups).
        group = self.attention.group
        backend = ring_kernel_family(self.attention.backend)
        causal = ring_causal(q_und, k_und, v_und, group=group, scale=scale, backend=backend)
        key, value = torch.cat([k_und_for_gen, k_gen], dim=1), torch.cat([v_und, v_gen], dim=1)
        valid = self._key_valid(key.shape[1], key.device)
        full = ring_attention(q_gen, key, value, valid, group=group, scale=scale, backend=backend, enable_gqa=True)
        return causal, full
