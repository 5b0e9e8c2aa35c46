"""Embeddings that compute only this rank's tokens under CP, instead of the whole sequence cut afterwards.

A plan cuts an embedding's output (`output: true`, dim 1 of a [B, S, D] result) where the module needs the whole
input (a latent grid, its shape) to know each token's position. Cut after the fact, the whole [B, S, D] output is
computed on every rank and, with its intermediates, is the peak of the cp forward: diffusers'
`CosmosLearnablePositionalEmbed` builds three [B, S, D] repeats, their sum and an fp32 quotient (3.2 GB per rank
at 704 x 1280 x 121 frames, 4.0x the ideal at cp=8); PixArt's `PatchEmbed` holds the whole embedded image and its
position sum (2 x 9.4 MB at 1024², 1.32x). For these classes dtp replaces the module's forward under CP by the same
math on the rank's token range (rows [r S / cp, (r + 1) S / cp) of the flattened grid, as `local_chunk` cuts), so
the chunks concatenated in rank order equal diffusers' output bit for bit (tests/unit/test_cp_local_embed.py).
`install_local_embed` returns a handle whose `remove()` restores the class's forward.
"""

from __future__ import annotations

import math
import types

import torch
from torch import nn

from ...errors import ForwardError
from .sequence import own_chunk


def token_range(n: int, rank: int, cp: int, what: str) -> tuple[int, int]:
    if n % cp:
        raise ForwardError(
            f"cp split of {what}: sequence length {n} (dim 1) is not divisible by the cp degree {cp}; "
            f"use a length that is a multiple of {cp} (e.g. {n + (-n) % cp}) or a smaller cp."
        )
    return rank * (n // cp), (rank + 1) * (n // cp)


def cosmos_learnable_pos_embed(module, hidden_states, *, rank: int, cp: int, what: str):
    """`CosmosLearnablePositionalEmbed.forward` for this rank's tokens: each token's embedding is
    pos_emb_t[t] + pos_emb_h[h] + pos_emb_w[w] over its own channels and its norm is per token (the `alpha` ratio
    norm.numel() / emb.numel() is 1 / D whatever the token count), so a token range needs no other token."""
    batch, _, frames, height, width = hidden_states.shape
    grid = (frames // module.patch_size[0], height // module.patch_size[1], width // module.patch_size[2])
    start, stop = token_range(math.prod(grid), rank, cp, what)
    index = torch.arange(start, stop, device=hidden_states.device)
    t, h, w = index // (grid[1] * grid[2]), index // grid[2] % grid[1], index % grid[2]
    emb = module.pos_emb_t[t] + module.pos_emb_h[h] + module.pos_emb_w[w]  # diffusers' order of the two sums
    emb = emb[None].repeat(batch, 1, 1)
    norm = torch.linalg.vector_norm(emb, dim=-1, keepdim=True, dtype=torch.float32)
    norm = torch.add(module.eps, norm, alpha=math.sqrt(norm.numel() / emb.numel()))
    return (emb / norm).type_as(hidden_states)


def whole_pos_embed(module, height: int, width: int, device):
    """`PatchEmbed.forward`'s position table for a (height, width) grid: cropped, interpolated or its buffer."""
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    if module.pos_embed_max_size:
        return module.cropped_pos_embed(height, width)
    if module.height != height or module.width != width:
        pos_embed = get_2d_sincos_pos_embed(
            embed_dim=module.pos_embed.shape[-1],
            grid_size=(height, width),
            base_size=module.base_size,
            interpolation_scale=module.interpolation_scale,
            device=device,
            output_type="pt",
        )
        return pos_embed.float().unsqueeze(0)
    return module.pos_embed


def patch_embed(module, latent, *, rank: int, cp: int, what: str):
    """diffusers' `PatchEmbed.forward` (PixArt, SD3, ...) keeping this rank's tokens right after the patch
    projection: the copy frees the whole projected image before the norm and the position sum run per token."""
    if module.pos_embed_max_size is not None:
        height, width = latent.shape[-2:]
    else:
        height, width = latent.shape[-2] // module.patch_size, latent.shape[-1] // module.patch_size
    latent = module.proj(latent).flatten(2).transpose(1, 2)  # BCHW -> BNC
    start, stop = token_range(latent.shape[1], rank, cp, what)
    latent = own_chunk(latent, 1, rank, cp, what)
    if module.layer_norm:
        latent = module.norm(latent)
    if module.pos_embed is None:
        return latent
    pos_embed = whole_pos_embed(module, height, width, latent.device)[:, start:stop]
    return (latent + pos_embed).to(latent.dtype)


def cosmos_patch_embed(module, hidden_states, *, rank: int, cp: int, what: str):
    """`CosmosPatchEmbed.forward` projecting this rank's patches only: its [B, T, H, W, D] output is channels-last,
    so the rank's tokens come back as [B, L, 1, 1, D], which the caller's `flatten(1, 3)` makes its [B, L, D]."""
    batch, channels, frames, height, width = hidden_states.shape
    p_t, p_h, p_w = module.patch_size
    patches = hidden_states.reshape(batch, channels, frames // p_t, p_t, height // p_h, p_h, width // p_w, p_w)
    patches = patches.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)  # [B, T H W, C p_t p_h p_w]
    start, stop = token_range(patches.shape[1], rank, cp, what)
    return module.proj(patches[:, start:stop])[:, :, None, None, :]


def anyflow_timestep(module, timestep, delta_timestep, encoder_hidden_states, token_per_frame, *, rank, cp, what):
    """`AnyFlowDualTimestepTextImageEmbedding.forward_timestep` for this rank's tokens: diffusers' own per-frame
    math (`token_per_frame` 1: [B, F, D] and [B, F, 6 D]), then each local token's frame row (token // tokens per
    frame), where diffusers `repeat_interleave`s every frame's rows to the whole sequence ([B, S, 6 D], 2.0 GB at
    81 frames of 480 x 832 in bf16) for the plan to cut afterwards. The same values, bit for bit."""
    whole = type(module).forward_timestep
    per_frame = whole(module, timestep, delta_timestep, encoder_hidden_states, 1)
    start, stop = token_range(per_frame[0].shape[1] * token_per_frame, rank, cp, what)
    frame = torch.arange(start, stop, device=per_frame[0].device) // token_per_frame
    return tuple(rows[:, frame] for rows in per_frame)


anyflow_timestep.method = "forward_timestep"  # replaced on the instance instead of `forward` (`install_local_embed`)


def _tokens_out(rule) -> bool:
    """The rule cuts output 0, a [B, S, D] token sequence, along dim 1."""
    return rule.name == 0 and rule.dim == 1 and rule.expected_dims in (None, 3) and not rule.flatten


def _grid_out(rule) -> bool:
    """The rule cuts output 0, a channels-last [B, T, H, W, D] grid, along its flattened token dims 1..3."""
    return rule.name == 0 and rule.dim == 1 and rule.expected_dims == 5 and rule.flatten


# module class name -> (the rank's output, which plan rule it implements, whether the instance has that form)
LOCAL_EMBEDS = {
    "CosmosLearnablePositionalEmbed": (cosmos_learnable_pos_embed, _tokens_out, lambda m: True),
    "CosmosPatchEmbed": (cosmos_patch_embed, _grid_out, lambda m: True),
    "PatchEmbed": (patch_embed, _tokens_out, lambda m: m.flatten),
}
# module class name -> (its method computing the rank's rows, the output indices the plan cuts along dim 1)
LOCAL_METHODS = {"AnyFlowDualTimestepTextImageEmbedding": (anyflow_timestep, (0, 1))}


class Restore:
    """A hook-handle look-alike: `remove()` drops the instance's forward, so the class's runs again."""

    def __init__(self, module: nn.Module, method: str = "forward"):
        self.module, self.method = module, method

    def remove(self) -> None:
        self.module.__dict__.pop(self.method, None)


def local_embed_for(module: nn.Module, rules: list):
    """The local forward for `module` when its class has one and its plan rule is the cut that forward makes
    (`LOCAL_EMBEDS`, `LOCAL_METHODS`), else None (the generic output hook then cuts the whole output)."""
    method = LOCAL_METHODS.get(type(module).__name__)
    if method is not None:
        local, outputs = method
        cut = sorted(r.name for r in rules if r.dim == 1 and r.expected_dims in (None, 3) and not r.flatten)
        plain = all(r.pad is None and r.when_dims is None for r in rules)
        return local if cut == list(outputs) and len(rules) == len(outputs) and plain else None
    entry = LOCAL_EMBEDS.get(type(module).__name__)
    if entry is None or len(rules) != 1 or rules[0].pad is not None:
        return None
    local, implements, has_form = entry
    return local if implements(rules[0]) and has_form(module) else None


def install_local_embed(module: nn.Module, path: str, local, rank: int, cp: int) -> Restore:
    """Make `module` compute only this rank's tokens (`local`, from `local_embed_for`); returns the restore handle."""
    what = f"output 0 of '{path}'"
    method = getattr(local, "method", "forward")

    def forward(self, *args):
        return local(self, *args, rank=rank, cp=cp, what=what)

    setattr(module, method, types.MethodType(forward, module))
    return Restore(module, method)
