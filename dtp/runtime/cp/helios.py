"""Helios' forward with the cp cut moved before its joins (plan key `cp.forward: {name: helios}`).

diffusers' `HeliosTransformer3DModel.forward` embeds the noisy latents (the current run, n tokens) and the long / mid /
short history latents (h tokens), then joins them in its own body, between any two modules: the tokens and their RoPE
rows `cat([history, current])`, temb `cat([t0 over h, t over n])` [B, h + n, D] and the per-token modulation
`cat([t0 rows over h, t rows over n])` [B, 6, h + n, D]: two distinct [6, D] rows materialised h + n times (2.14 GB
in bf16 at 21 x 60 x 104 latents, 2054 + 32760 tokens), whole on every rank until the blocks' `tail` split took the
rank's rows. This copy of the forward cuts each run first, as `tail.py` cuts [head | tail] (the history as the head,
the current run as the tail; with `pad` each zero-padded to a multiple of cp, `first` and `last`), and makes every
join of the rank's rows: [history_r | current_r] tokens and RoPE rows, and the modulation's two rows expanded over
the rank's h_r + n_r rows only. The blocks and the output norm get the local current count, as `count: true` gave
them; proj_out's `gather` (`trim: last`) puts the current run back together. Every other line is diffusers' forward
(0.42.1); at cp = 1 it is diffusers' forward, bit for bit (tests/unit/test_cp_helios.py).

The rank's pad rows of temb / the modulation hold t0 / t rows (diffusers' tail split zero-filled them): pad queries'
outputs are never read (pad keys masked, the current pad rows dropped at the gather, the history's never gathered).
Example: 2054 history + 32760 current tokens, cp = 8: rank 7 holds history rows 1799..2053 (255, then 2 pad) and
current rows 28665..32759 (4095, then 1 pad); its modulation is [B, 6, 4353, D], not [B, 6, 34814, D].
"""

from __future__ import annotations

import types

import torch
from diffusers.utils import apply_lora_scale

from .local_embed import Restore
from .sequence import local_chunk, padded_chunk
from .tail import Piece


class RunCut:
    """Cuts the forward's two runs into this rank's rows and records them in `pads` as a `tail` split with `pad`
    does (`first`: the history, `last`: the current run); `pad` False: a run cp does not divide is a ForwardError."""

    def __init__(self, rank: int, cp: int, pads, pad: bool):
        self.rank, self.cp, self.pads, self.pad = rank, cp, pads, pad

    def __call__(self, x: torch.Tensor, run: str, what: str) -> torch.Tensor:
        """The rank's rows (dim 1) of the run `run` ("first" history, "last" current), a copy: the whole run, a view
        of a module's output, is freed as the forward drops it."""
        if self.pad:
            chunk, valid = padded_chunk(x, 1, self.rank, self.cp, what)
        else:
            chunk = local_chunk(x, 1, self.rank, self.cp, what)
            valid = chunk.shape[1]
        self.record(run, Piece(chunk.shape[1], valid, x.shape[1]))
        return chunk.clone(memory_format=torch.contiguous_format)

    def record(self, run: str, piece: Piece) -> None:
        if self.pad and self.pads is not None:
            slot = self.pads.slots[run]
            slot.local, slot.valid, slot.total = piece.local, piece.valid, piece.total
            slot.padded = piece.local * self.cp != piece.total


def _history(self, short, mid, long, indices_short, indices_mid, indices_long):
    """diffusers' steps 3-5: the history tokens and RoPE rows, as lists in join order (long, mid, short)."""
    from diffusers.models.transformers.transformer_helios import center_down_sample_3d, pad_for_3d_conv

    tokens, rope = [], []
    if short is not None and indices_short is not None:
        short = self.patch_short(short)
        _, _, _, H1, W1 = short.shape
        tokens.insert(0, short.flatten(2).transpose(1, 2))
        rope_short = self.rope(frame_indices=indices_short, height=H1, width=W1, device=short.device)
        rope.insert(0, rope_short.flatten(2).transpose(1, 2))
    if mid is not None and indices_mid is not None:
        mid = self.patch_mid(pad_for_3d_conv(mid, (2, 4, 4)))
        tokens.insert(0, mid.flatten(2).transpose(1, 2))
        rope_mid = self.rope(frame_indices=indices_mid, height=H1, width=W1, device=mid.device)
        rope_mid = center_down_sample_3d(pad_for_3d_conv(rope_mid, (2, 2, 2)), (2, 2, 2))
        rope.insert(0, rope_mid.flatten(2).transpose(1, 2))
    if long is not None and indices_long is not None:
        long = self.patch_long(pad_for_3d_conv(long, (4, 8, 8)))
        tokens.insert(0, long.flatten(2).transpose(1, 2))
        rope_long = self.rope(frame_indices=indices_long, height=H1, width=W1, device=long.device)
        rope_long = center_down_sample_3d(pad_for_3d_conv(rope_long, (4, 4, 4)), (4, 4, 4))
        rope.insert(0, rope_long.flatten(2).transpose(1, 2))
    return tokens, rope


def _joined(pieces: list, like: torch.Tensor) -> torch.Tensor:
    """The history run: `cat(pieces)`, or no rows (`like`'s [B, 0, C]) without any history."""
    return torch.cat(pieces, dim=1) if pieces else like[:, :0]


def _modulation(self, timestep, encoder_hidden_states, batch_size, history_context_length, original_context_length):
    """diffusers' temb / modulation step over the rank's rows: the same code with the local run lengths, so each
    distinct row is expanded over the rank's h_r + n_r rows only. Returns (temb, timestep_proj, text)."""
    total = history_context_length + original_context_length
    if self.zero_history_timestep:  # diffusers: `indices_hidden_states is not None and ...`, never None by then
        timestep_t0 = torch.zeros((1), dtype=timestep.dtype, device=timestep.device)
        temb_t0, timestep_proj_t0, _ = self.condition_embedder(
            timestep_t0, encoder_hidden_states, is_return_encoder_hidden_states=False
        )
        temb_t0 = temb_t0.unsqueeze(1).expand(batch_size, history_context_length, -1)
        timestep_proj_t0 = (
            timestep_proj_t0.unflatten(-1, (6, -1)).view(1, 6, 1, -1).expand(batch_size, -1, history_context_length, -1)
        )
    temb, timestep_proj, encoder_hidden_states = self.condition_embedder(timestep, encoder_hidden_states)
    timestep_proj = timestep_proj.unflatten(-1, (6, -1))
    main_repeat_size = original_context_length if self.zero_history_timestep else total
    temb = temb.view(batch_size, 1, -1).expand(batch_size, main_repeat_size, -1)
    timestep_proj = timestep_proj.view(batch_size, 6, 1, -1).expand(batch_size, 6, main_repeat_size, -1)
    if self.zero_history_timestep:
        temb = torch.cat([temb_t0, temb], dim=1)
        timestep_proj = torch.cat([timestep_proj_t0, timestep_proj], dim=2)
    if timestep_proj.ndim == 4:
        timestep_proj = timestep_proj.permute(0, 2, 1, 3)
    return temb, timestep_proj, encoder_hidden_states


@apply_lora_scale("attention_kwargs")
def helios_forward(
    self,
    hidden_states: torch.Tensor,
    timestep: torch.LongTensor,
    encoder_hidden_states: torch.Tensor,
    indices_hidden_states=None,
    indices_latents_history_short=None,
    indices_latents_history_mid=None,
    indices_latents_history_long=None,
    latents_history_short=None,
    latents_history_mid=None,
    latents_history_long=None,
    return_dict: bool = True,
    attention_kwargs=None,
    *,
    cut: RunCut,
):
    """`HeliosTransformer3DModel.forward` on the rank's [history_r | current_r] rows (module docstring)."""
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    # 1. Input
    batch_size = hidden_states.shape[0]
    p_t, p_h, p_w = self.config.patch_size

    # 2. Process noisy latents: the current run, cut at once
    hidden_states = self.patch_embedding(hidden_states)
    _, _, post_patch_num_frames, post_patch_height, post_patch_width = hidden_states.shape
    if indices_hidden_states is None:
        indices_hidden_states = torch.arange(0, post_patch_num_frames).unsqueeze(0).expand(batch_size, -1)
    hidden_states = hidden_states.flatten(2).transpose(1, 2)
    rotary_emb = self.rope(
        frame_indices=indices_hidden_states,
        height=post_patch_height,
        width=post_patch_width,
        device=hidden_states.device,
    )
    rotary_emb = rotary_emb.flatten(2).transpose(1, 2)
    current = cut(hidden_states, "last", "Helios' current tokens")
    rotary_current = cut(rotary_emb, "last", "Helios' current RoPE rows")
    del hidden_states, rotary_emb  # the whole run: freed before the histories are embedded

    # 3-5. Process short / mid / long history latents: the history run, cut, then joined with the current rows
    tokens, rope = _history(
        self,
        latents_history_short,
        latents_history_mid,
        latents_history_long,
        indices_latents_history_short,
        indices_latents_history_mid,
        indices_latents_history_long,
    )
    history = cut(_joined(tokens, current), "first", "Helios' history tokens")
    rotary_history = cut(_joined(rope, rotary_current), "first", "Helios' history RoPE rows")
    hidden_states = torch.cat([history, current], dim=1)
    rotary_emb = torch.cat([rotary_history, rotary_current], dim=1)
    original_context_length = current.shape[1]  # the rank's current count, pad included (`count: true`'s value)
    history_context_length = history.shape[1]
    del tokens, rope, history, current, rotary_history, rotary_current

    temb, timestep_proj, encoder_hidden_states = _modulation(
        self, timestep, encoder_hidden_states, batch_size, history_context_length, original_context_length
    )

    # 6. Transformer blocks
    hidden_states = hidden_states.contiguous()
    encoder_hidden_states = encoder_hidden_states.contiguous()
    rotary_emb = rotary_emb.contiguous()
    for block in self.blocks:
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            hidden_states = self._gradient_checkpointing_func(
                block, hidden_states, encoder_hidden_states, timestep_proj, rotary_emb, original_context_length
            )
        else:
            hidden_states = block(
                hidden_states, encoder_hidden_states, timestep_proj, rotary_emb, original_context_length
            )

    # 7. Normalization (proj_out's `gather` puts the current rows back together, in order)
    hidden_states = self.norm_out(hidden_states, temb, original_context_length)
    hidden_states = self.proj_out(hidden_states)

    # 8. Unpatchify
    hidden_states = hidden_states.reshape(
        batch_size, post_patch_num_frames, post_patch_height, post_patch_width, p_t, p_h, p_w, -1
    )
    hidden_states = hidden_states.permute(0, 7, 1, 4, 2, 5, 3, 6)
    output = hidden_states.flatten(6, 7).flatten(4, 5).flatten(2, 3)
    if not return_dict:
        return (output,)
    return Transformer2DModelOutput(sample=output)


def install_helios_forward(model, rule, pads, rank: int, cp: int, group=None) -> Restore:
    """Replace `model.forward` (a HeliosTransformer3DModel, checked in resolve) by `helios_forward` on this rank's
    rows; `rule` is the plan's `ForwardRule` (its `pad`). The handle's `remove()` restores the class's forward."""
    cut = RunCut(rank, cp, pads, rule.pad is not None)

    def forward(self, *args, **kwargs):
        return helios_forward(self, *args, cut=cut, **kwargs)

    model.forward = types.MethodType(forward, model)
    return Restore(model)
