"""Per-class processor adapters: the same attention math in a form CP can split. Installed only under CP.

Mochi's `MochiAttnProcessor2_0` runs one SDPA call per sample over [video, valid text tokens], with
the padded text tokens removed by index (`torch.nonzero` of the mask). Under CP the text is split
with its mask, so ranks would hold different numbers of valid tokens and their all-to-alls / ring
messages would not match. `MochiCpAttnProcessor` computes the same result in one call over
[video, all text] with the padded text keys masked out: masking a key with -inf gives it weight 0,
exactly like removing it, and the padded text queries' outputs are zeroed, as the original pads
them with zeros. That single SDPA call is then routed to CP attention (`sdpa.py`).

Qwen-Image 2.1's block-causal processor has its adapter in `block_causal.py`; Sana's linear attention (no softmax:
its token sums are all-reduced instead of routed) in `linear.py`; Wan Animate's per-frame face adapter (each token's
frame from its global index) in `frames.py`; HunyuanVideo 1.5's joint mask passed as a key mask in `joint_mask.py`;
Kandinsky 6 SR's NABLA block mask from whole-sequence block statistics in `nabla.py`;
Cosmos 3's packed dual-pathway attention in `packed.py`.

`install_adapter` swaps the processor in and returns a handle whose `remove()` puts the original
back, so `remove_cp` undoes it like the hooks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .block_causal import QwenImage21CpAttnProcessor
from .frames import WanAnimateFaceCpProcessor
from .joint_mask import HunyuanVideo15CpAttnProcessor
from .linear import SanaLinearCpAttnProcessor, SanaVideoLinearCpAttnProcessor
from .nabla import Kandinsky6SRCpProcessor
from .packed import PackedCpAttnProcessor


def _mochi_rope(x, freqs_cos, freqs_sin):
    """MochiAttnProcessor2_0's interleaved rotary embedding, unchanged."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


def _heads(x, heads: int, norm):
    x = x.unflatten(2, (heads, -1))
    return norm(x) if norm is not None else x


class MochiCpAttnProcessor:
    """MochiAttnProcessor2_0 with padded text keys masked instead of removed (see the module docstring)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb=None):
        query = _heads(attn.to_q(hidden_states), attn.heads, attn.norm_q)
        key = _heads(attn.to_k(hidden_states), attn.heads, attn.norm_k)
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        encoder_query = _heads(attn.add_q_proj(encoder_hidden_states), attn.heads, attn.norm_added_q)
        encoder_key = _heads(attn.add_k_proj(encoder_hidden_states), attn.heads, attn.norm_added_k)
        encoder_value = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        if image_rotary_emb is not None:
            query, key = _mochi_rope(query, *image_rotary_emb), _mochi_rope(key, *image_rotary_emb)

        video, text = query.shape[1], encoder_query.shape[1]
        valid = torch.cat([attention_mask.new_ones(attention_mask.shape[0], video), attention_mask], dim=1).bool()
        q, k, v = (
            torch.cat(pair, dim=1).transpose(1, 2)
            for pair in ((query, encoder_query), (key, encoder_key), (value, encoder_value))
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], dropout_p=0.0, is_causal=False)
        out = out.masked_fill(~valid[:, None, :, None], 0.0)  # padded text queries: zeros, as the original's F.pad
        hidden_states, encoder_hidden_states = out.transpose(1, 2).flatten(2, 3).split_with_sizes((video, text), dim=1)

        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if hasattr(attn, "to_add_out"):
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


# processor class name -> factory taking the module's CP attention (its `group` fixes the whole sequence's length)
ADAPTERS = {
    "MochiAttnProcessor2_0": lambda attention: MochiCpAttnProcessor(),
    "QwenImage21AttnProcessor": QwenImage21CpAttnProcessor,
    "SanaLinearAttnProcessor2_0": lambda attention: SanaLinearCpAttnProcessor(attention.group),
    "SanaLinearAttnProcessor3_0": lambda attention: SanaVideoLinearCpAttnProcessor(attention.group),
    "WanAnimateFaceBlockAttnProcessor": lambda attention: WanAnimateFaceCpProcessor(attention.group),
    "HunyuanVideo15AttnProcessor2_0": lambda attention: HunyuanVideo15CpAttnProcessor(),
    "Kandinsky6SRAttnProcessor": Kandinsky6SRCpProcessor,
    "Cosmos3AttnProcessor": PackedCpAttnProcessor,
}


class _Restore:
    """A hook-handle look-alike: `remove()` puts the original processor back."""

    def __init__(self, attn: nn.Module, processor):
        self.attn, self.processor = attn, processor

    def remove(self) -> None:
        self.attn.processor = self.processor


def install_adapter(attn: nn.Module, attention=None) -> list:
    """Swap in the CP adapter for `attn`'s processor class, if there is one; returns restore handles."""
    adapter = ADAPTERS.get(type(attn.processor).__name__)
    if adapter is None:
        return []
    original = attn.processor
    attn.processor = adapter(attention)
    return [_Restore(attn, original)]
