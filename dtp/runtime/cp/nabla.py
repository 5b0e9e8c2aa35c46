"""NABLA block-sparse attention under CP: the block mask chosen from whole-sequence block statistics.

Kandinsky 6 SR's processor (`Kandinsky6SRAttnProcessor`) builds a flex `BlockMask` per head from 64-token block
means of q and k (`nabla_block_mask`: softmax of qa ka^T / sqrt(D) over every key block, the blocks kept up to a
cumulative threshold, or'ed with the sliding-tile prior `sta` [nb, nb]) and attends through it. The forward has laid
the tokens out block-major (each 64 consecutive tokens one 8 x 8 patch of a frame), so a cut into cp contiguous
chunks of whole blocks (S / cp a multiple of 64) gives rank r query blocks [r nb / cp, (r + 1) nb / cp). Each
softmax row of the block map is one query block's, so the mask's rows are independent:

- Ulysses: after the all-to-all a rank holds the whole sequence for H / cp heads; the mask is built there, by
  diffusers' own `nabla_block_mask`, exactly one process's mask for those heads, and flex attends through it.
- ring: a rank builds its query blocks' rows, [B, H, nb / cp, nb], from its own query means and every rank's key
  means (an all-gather of [B, H, nb / cp, D] per attention: the gathered region, B H nb D values); each ring step
  attends the rank's queries to the visiting key chunk through the rows' columns of that chunk (a BlockMask of
  [nb / cp, nb / cp]), and the steps merge by log-sum-exp (`ring.merge`).

Example: 2 frames of 8 x 16 tokens (4 blocks), cp = 2: rank 1 holds blocks 2, 3 (tokens 128..255); under ring it
gathers the 4 key means and builds rows 2, 3 of the [4, 4] block map. Full size (31 frames of 32 x 32 tokens, 496
blocks, 28 heads, cp = 8): the gathered key means are 496 x 28 x 64 values (1.8 MB in bf16) a layer, the rows
[28, 62, 496] (0.9 M).
"""

from __future__ import annotations

import math

import torch
from diffusers.models import attention_dispatch
from diffusers.models.transformers.transformer_kandinsky6_sr import apply_rotary, nabla_block_mask
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

from ...errors import ForwardError
from ...styles.collectives import all_gather_along, send_to_next, wait_for
from .ring import merge
from .ulysses import ulysses_attention

BLOCK = 64  # tokens of one NABLA block (an 8 x 8 patch of one frame: FRACTAL_BLOCK_SIZE ** 2)


def block_means(x: torch.Tensor) -> torch.Tensor:
    """[B, S, H, D] -> [B, H, S / 64, D]: each 64-token block's mean, as `nabla_block_mask` takes it."""
    b, s, h, d = x.shape
    return x.transpose(1, 2).reshape(b, h, s // BLOCK, BLOCK, d).mean(-2)


def mask_rows(qa: torch.Tensor, ka: torch.Tensor, sta_rows: torch.Tensor, threshold: float) -> torch.Tensor:
    """Rows of NABLA's block mask for the query blocks `qa` [B, H, n, D] over every key block `ka` [B, H, nb, D]:
    `nabla_block_mask`'s math on those rows (each row its own softmax, sort and cumulative threshold), or'ed with
    the prior's rows `sta_rows` [n, nb]. Returns [B, H, n, nb] bool."""
    attn_map = torch.softmax((qa @ ka.transpose(-2, -1)) / math.sqrt(qa.shape[-1]), dim=-1)
    vals, inds = attn_map.sort(-1)
    mask = (vals.cumsum_(-1) >= 1 - threshold).int().gather(-1, inds.argsort(-1))
    return torch.logical_or(mask, sta_rows)


def block_mask(mask: torch.Tensor, dtype: torch.dtype) -> tuple[BlockMask, dict | None]:
    """A flex BlockMask of 64-token blocks from a [B, H, nq, nk] bool block mask (every kept block a full block, as
    `nabla_block_mask` builds it), and the kernel options diffusers' flex backend would pass for it."""
    kv_nb = mask.sum(-1).to(torch.int32)
    kv_inds = mask.int().argsort(dim=-1, descending=True).to(torch.int32)
    built = BlockMask.from_kv_blocks(torch.zeros_like(kv_nb), kv_inds, kv_nb, kv_inds, BLOCK_SIZE=BLOCK, mask_mod=None)
    default_m = 64 if dtype == torch.float32 else 128  # `_native_flex_attention`'s tile rule for a 64-token mask
    return built, (None if BLOCK % default_m == 0 else {"BLOCK_M": BLOCK})


def masked_block(q, k, v, mask: torch.Tensor, scale: float):
    """One ring step: q [B, s, H, D] over one key chunk through its block mask [B, H, nq, nk], in flex as the
    processor attends: `(out [B, s, H, D], lse [B, H, s] fp32)`. Flex gives a query row with no kept block out 0 and
    lse -inf (zero weight in `merge`). As in one process, flex honours the block sparsity when compiled; eager flex
    runs the BlockMask's mask_mod (None here, as diffusers builds it) over every block, i.e. dense attention, and so
    does this step then: the result matches one process either way."""
    bm, options = block_mask(mask, q.dtype)
    out, aux = flex_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm, scale=scale,
        return_aux=AuxRequest(lse=True), kernel_options=options,
    )  # fmt: skip
    return out.transpose(1, 2), aux.lse.float()


class Kandinsky6SRCpProcessor:
    """`Kandinsky6SRAttnProcessor` on a rank's whole blocks, Ulysses or ring (module docstring)."""

    def __init__(self, attention):
        self.mode, self.group = attention.mode, attention.group

    def __call__(self, attn, hidden_states, rotary_emb, sparse_params):
        query = attn.to_query(hidden_states).unflatten(-1, (attn.num_heads, -1))
        key = attn.to_key(hidden_states).unflatten(-1, (attn.num_heads, -1))
        value = attn.to_value(hidden_states).unflatten(-1, (attn.num_heads, -1))
        query = apply_rotary(attn.query_norm(query.float()).type_as(query), rotary_emb)
        key = apply_rotary(attn.key_norm(key.float()).type_as(key), rotary_emb)
        self._check(query.shape[1])
        sta, threshold = sparse_params["sta_mask"], sparse_params["threshold"]
        if self.mode == "ulysses":

            def attend(q, k, v, unused_mask):
                return _whole(q, k, v, sta, threshold)

            out = ulysses_attention(query, key, value, None, group=self.group, attend=attend)
        else:  # K and V as the ring's one buffer, and no other copy of them alive through the ring (`ring`)
            held, d_k = [torch.cat([key, value], dim=-1)], key.shape[-1]
            del key, value
            out = self.ring(query, held, d_k, sta, threshold)
        return attn.out_layer(out.flatten(2, 3))

    def _check(self, local: int) -> None:
        if self.mode == "usp":
            raise ForwardError(
                "Kandinsky 6 SR's NABLA attention runs Ulysses or ring, not Ulysses x ring (USP); use cp_mode "
                "'ulysses' or 'ring' on a plain cp mesh."
            )
        if local % BLOCK:
            cp = self.group.size()
            raise ForwardError(
                f"NABLA attention under cp={cp}: a rank holds {local} tokens, not whole 64-token blocks; the tile's "
                f"frames x (height / 8) x (width / 8) blocks ({local * cp / BLOCK:g}) must divide by cp."
            )

    def ring(self, query, held: list, d_k: int, sta, threshold: float):
        """Ring attention through the rank's rows of the whole sequence's block mask (module docstring). held: a
        list of one tensor, this rank's K and V concatenated on the last dim (`[B, S/cp, H, Dk + Dv]`), which the ring
        empties: no other frame keeps the rank's own chunk (nor separate K and V), so that once it has been sent the
        ring holds 2 K/V chunks (the one computed, the one received). Merges after the first add into the running
        fp32 sum in place (`merge`'s into)."""
        kv, cp, rank = held.pop(), self.group.size(), self.group.rank()
        local_blocks = query.shape[1] // BLOCK
        keys = all_gather_along(block_means(kv[..., :d_k]), self.group, 2)  # [B, H, nb, D]: every rank's key means
        rows = sta[rank * local_blocks : (rank + 1) * local_blocks]
        mask = mask_rows(block_means(query), keys, rows, threshold)  # [B, H, nb / cp, nb]
        scale, out, lse = query.shape[-1] ** -0.5, None, None
        for step in range(cp):
            incoming = send_to_next(kv, self.group) if step < cp - 1 else None  # issued before the step's compute
            source = (rank - step) % cp
            columns = mask[..., source * local_blocks : (source + 1) * local_blocks]
            block = masked_block(query, kv[..., :d_k], kv[..., d_k:], columns, scale)
            out, lse = block if out is None else merge(out, lse, *block, into=step > 1)
            block = None  # in the sum now: not alive through the next step's send and compute
            if incoming is not None:
                kv, incoming = wait_for(incoming), None  # the chunk sent is dropped here, not at the next send
        return out.to(query.dtype)


def _whole(q, k, v, sta, threshold: float):
    """Ulysses' attention on whole sequences for this rank's heads: the processor's own mask and flex call."""
    mask = nabla_block_mask(q.transpose(1, 2), k.transpose(1, 2), sta, thr=threshold)
    return attention_dispatch.dispatch_attention_fn(
        q, k, v, attn_mask=mask, backend=attention_dispatch.AttentionBackendName.FLEX
    )
