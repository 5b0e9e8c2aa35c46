"""Per-frame cross-attention under CP: each video token attends to its own frame's keys, known by its global index.

Wan 2.2 Animate's face adapter (`WanAnimateFaceBlockAttnProcessor`) pairs the S video tokens with the T motion
frames of the face encoder by position: it unflattens the queries into [T, S / T] (frame-major tokens, S / T a frame)
and lets the tokens of frame t attend to the N motion tokens of frame t only. Under CP a rank holds S / cp contiguous
tokens, which need not be whole frames (21 latent frames at cp = 8), so the processor's own unflatten would pair
them with the wrong frames. The motion tokens are few ([B, T, N, C], N = 5) and whole on every rank, so no exchange is
needed: the rank knows its global token range [r S / cp, (r + 1) S / cp), hence each token's frame
g // (S / T); it takes the keys of the frames it touches and masks, per token, every key of another frame (weight 0,
as if absent), in one attention call. Exact up to float rounding.

Example: S = 16 tokens of T = 2 frames (8 a frame), cp = 4: rank 1 holds tokens 4..7 (frame 0) and attends to frame
0's N keys; at cp = 8 nothing changes but the count. 21 frames of 1560 tokens at cp = 8: rank 1 holds tokens
4095..8189, frames 2..5, 4 x N keys, each token seeing its frame's N.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...errors import ForwardError


def frame_size(tokens: int, frames: int) -> int:
    """Tokens per frame of a frame-major sequence of `tokens` tokens in `frames` equal frames."""
    if tokens % frames:
        raise ForwardError(
            f"per-frame attention: {tokens} video tokens are not {frames} equal frames (the face adapter pairs them "
            f"by position)."
        )
    return tokens // frames


def frame_of_tokens(start: int, count: int, per_frame: int, device) -> torch.Tensor:
    """The frame of each of the global tokens [start, start + count), `per_frame` tokens a frame.
    Start 4, count 8, 8 a frame: [0, 0, 0, 0, 1, 1, 1, 1]."""
    return torch.arange(start, start + count, device=device) // per_frame


class WanAnimateFaceCpProcessor:
    """`WanAnimateFaceBlockAttnProcessor`'s math on a rank's token range (see the module docstring)."""

    def __init__(self, group):
        self.group = group

    def offset(self, local: int) -> int:
        """The global index of this rank's first token (contiguous chunks in rank order)."""
        return dist.get_rank(self.group) * local

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None):
        if attention_mask is not None:
            raise ForwardError("the face adapter's multiplicative motion mask is not supported under cp; use cp=1.")
        hidden_states = attn.pre_norm_q(hidden_states)
        encoder_hidden_states = attn.pre_norm_kv(encoder_hidden_states)
        batch, frames, n, _ = encoder_hidden_states.shape
        local = hidden_states.shape[1]
        tokens = local * dist.get_world_size(self.group)
        start, per_frame = self.offset(local), frame_size(tokens, frames)
        frame = frame_of_tokens(start, local, per_frame, hidden_states.device)  # [S_local]
        first, last = start // per_frame, (start + local - 1) // per_frame  # from shapes and the rank: no device read
        seen = encoder_hidden_states[:, first : last + 1].flatten(1, 2)  # [B, (last - first + 1) N, C]

        query = attn.norm_q(attn.to_q(hidden_states).unflatten(2, (attn.heads, -1)))
        key = attn.norm_k(attn.to_k(seen).unflatten(2, (attn.heads, -1)))
        value = attn.to_v(seen).unflatten(2, (attn.heads, -1))
        key_frame = torch.arange(first, last + 1, device=frame.device).repeat_interleave(n)  # [K]
        mask = frame.unsqueeze(1) == key_frame.unsqueeze(0)  # [S_local, K]: a token sees its own frame's keys
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=mask
        )
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out(out)
