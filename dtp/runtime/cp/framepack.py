"""FramePack's forward with the cp cut moved before its joins (plan key `cp.forward: {name: framepack}`).

diffusers' `HunyuanVideoFramepackTransformer3DModel.forward` embeds the noisy latents and the clean / 2x / 4x history
latents, then packs them in its own body (`_pack_history_states`): the tokens `cat([4x, 2x, clean, noisy])` and their
RoPE (cos, sin) rows alike, one `cat` per history, each a whole-sequence tensor ([1, 123560, 3072], 0.76 GB in bf16,
twice, at 129 frames of 720 x 1280), on every rank until the plan's split at the first block took the rank's rows.
This copy of the forward takes the rank's rows of the packed sequence from the streams themselves: rank r holds the
padded rows [r c, (r + 1) c) of the S packed tokens (c = S / cp, or ceil(S / cp) with `pad`, the pad rows zeros at
the end: the `first` padded sequence among the attentions' keys), the rows of each stream that fall in that range,
joined; the RoPE rows alike. The cut is recorded as a padded input split would record it (`PadState`: the `first`
slot, the joint mask's segment `hidden_states`, and the split id `forward`, whose rows the plan's `keep` reads). The
text / image condition and the joint mask are still cut by the plan's splits at the blocks. Every other line is
diffusers' forward (0.42.1); at cp = 1 it is diffusers' forward, bit for bit (tests/unit/test_cp_framepack.py).
Example: 4 + 8 + 16 history + 32 noisy tokens = 60, cp = 8: c = 8; rank 1 holds packed rows 8..15: 2x rows 4..7 and
clean rows 0..3; rank 7 holds rows 56..59 (noisy 28..31), then 4 pad rows.
"""

from __future__ import annotations

import types

import torch
from diffusers.utils import apply_lora_scale

from ...errors import ForwardError
from .local_embed import Restore

FORWARD_ID = "forward"  # the split id this cut is recorded under in `PadState.lengths` (a `keep`'s `of`)


class JointCut:
    """This rank's rows of the join of several tensors along one dim, without the join (module docstring)."""

    def __init__(self, rank: int, cp: int, pads, pad: bool):
        self.rank, self.cp, self.pads, self.pad = rank, cp, pads, pad
        self.total = 0

    def rows(self, pieces: list, dim: int, what: str) -> tuple[torch.Tensor, int, int]:
        """`(chunk, valid, total)`: the rank's rows of `cat(pieces, dim)` (a copy; zero rows after the `valid` real
        ones with `pad`), and the join's length; without `pad`, a length cp does not divide is a ForwardError."""
        total = sum(piece.shape[dim] for piece in pieces)
        if not self.pad and total % self.cp:
            raise ForwardError(
                f"cp split of {what}: sequence length {total} (dim {dim}) is not divisible by the cp degree "
                f"{self.cp}; use a length that is a multiple of {self.cp} or a plan whose cp.forward has `pad`."
            )
        size = -(-total // self.cp)
        start = min(self.rank * size, total)
        stop = min(start + size, total)
        parts, offset = [], 0
        for piece in pieces:
            low, high = max(start, offset), min(stop, offset + piece.shape[dim])
            if high > low:
                parts.append(piece.narrow(dim, low - offset, high - low))
            offset += piece.shape[dim]
        if stop - start < size:
            first = pieces[0]
            parts.append(first.new_zeros(*first.shape[:dim], size - (stop - start), *first.shape[dim + 1 :]))
        parts = parts or [pieces[0].narrow(dim, 0, 0)]  # an empty join: no rows
        return torch.cat(parts, dim=dim), stop - start, total

    def tokens(self, pieces: list, name: str, what: str) -> torch.Tensor:
        """The rank's packed tokens (dim 1), recorded in `pads` as an input split `name` padded `first`."""
        chunk, valid, total = self.rows(pieces, 1, what)
        self.total = total  # the whole packed length of this forward
        if self.pads is not None:
            self.pads.lengths[FORWARD_ID] = (chunk.shape[1], total)
            if self.pad:
                slot = self.pads.slots["first"]
                slot.local, slot.valid, slot.total = chunk.shape[1], valid, total
                slot.padded = chunk.shape[1] * self.cp != total
                self.pads.names[name] = "first"
        return chunk


def _streams(self, hidden_states, clean, history_2x, history_4x, rope, rope_clean, rope_2x, rope_4x, height, width):
    """`_pack_history_states` without its joins: the tokens and the RoPE (cos, sin) pairs in join order."""
    tokens, ropes = [hidden_states], [rope]
    if clean is not None and rope_clean is not None:
        tokens.insert(0, clean)
        ropes.insert(0, rope_clean)
    if history_2x is not None and rope_2x is not None:
        tokens.insert(0, history_2x)
        ropes.insert(0, self._pad_rotary_emb(rope_2x, height, width, (2, 2, 2)))
    if history_4x is not None and rope_4x is not None:
        tokens.insert(0, history_4x)
        ropes.insert(0, self._pad_rotary_emb(rope_4x, height, width, (4, 4, 4)))
    return tokens, ropes


@apply_lora_scale("attention_kwargs")
def framepack_forward(
    self,
    hidden_states: torch.Tensor,
    timestep: torch.LongTensor,
    encoder_hidden_states: torch.Tensor,
    encoder_attention_mask: torch.Tensor,
    pooled_projections: torch.Tensor,
    image_embeds: torch.Tensor,
    indices_latents: torch.Tensor,
    guidance: torch.Tensor | None = None,
    latents_clean: torch.Tensor | None = None,
    indices_latents_clean: torch.Tensor | None = None,
    latents_history_2x: torch.Tensor | None = None,
    indices_latents_history_2x: torch.Tensor | None = None,
    latents_history_4x: torch.Tensor | None = None,
    indices_latents_history_4x: torch.Tensor | None = None,
    attention_kwargs=None,
    return_dict: bool = True,
    *,
    cut: JointCut,
):
    """`HunyuanVideoFramepackTransformer3DModel.forward` on the rank's packed rows (module docstring)."""
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    batch_size, num_channels, num_frames, height, width = hidden_states.shape
    p, p_t = self.config.patch_size, self.config.patch_size_t
    post_patch_num_frames = num_frames // p_t
    post_patch_height = height // p
    post_patch_width = width // p
    original_context_length = post_patch_num_frames * post_patch_height * post_patch_width

    if indices_latents is None:
        indices_latents = torch.arange(0, num_frames).unsqueeze(0).expand(batch_size, -1)

    hidden_states = self.x_embedder(hidden_states)
    image_rotary_emb = self.rope(frame_indices=indices_latents, height=height, width=width, device=hidden_states.device)

    latents_clean, latents_history_2x, latents_history_4x = self.clean_x_embedder(
        latents_clean, latents_history_2x, latents_history_4x
    )

    if latents_clean is not None and indices_latents_clean is not None:
        image_rotary_emb_clean = self.rope(
            frame_indices=indices_latents_clean, height=height, width=width, device=hidden_states.device
        )
    if latents_history_2x is not None and indices_latents_history_2x is not None:
        image_rotary_emb_history_2x = self.rope(
            frame_indices=indices_latents_history_2x, height=height, width=width, device=hidden_states.device
        )
    if latents_history_4x is not None and indices_latents_history_4x is not None:
        image_rotary_emb_history_4x = self.rope(
            frame_indices=indices_latents_history_4x, height=height, width=width, device=hidden_states.device
        )

    # the packing, of the rank's rows only (diffusers: `self._pack_history_states(...)`)
    tokens, ropes = _streams(
        self,
        hidden_states,
        latents_clean,
        latents_history_2x,
        latents_history_4x,
        image_rotary_emb,
        image_rotary_emb_clean,
        image_rotary_emb_history_2x,
        image_rotary_emb_history_4x,
        post_patch_height,
        post_patch_width,
    )
    hidden_states = cut.tokens(tokens, "hidden_states", "FramePack's packed tokens")
    image_rotary_emb = tuple(cut.rows([r[i] for r in ropes], 0, "FramePack's RoPE rows")[0] for i in (0, 1))
    del tokens, ropes, latents_clean, latents_history_2x, latents_history_4x

    temb, _ = self.time_text_embed(timestep, pooled_projections, guidance)
    encoder_hidden_states = self.context_embedder(encoder_hidden_states, timestep, encoder_attention_mask)

    encoder_hidden_states_image = self.image_projection(image_embeds)
    attention_mask_image = encoder_attention_mask.new_ones((batch_size, encoder_hidden_states_image.shape[1]))

    # must cat before (not after) encoder_hidden_states, due to attn masking
    encoder_hidden_states = torch.cat([encoder_hidden_states_image, encoder_hidden_states], dim=1)
    encoder_attention_mask = torch.cat([attention_mask_image, encoder_attention_mask], dim=1)

    latent_sequence_length = cut.total  # the whole packed length: diffusers' joint mask, cut by the plan's `segments`
    condition_sequence_length = encoder_hidden_states.shape[1]
    sequence_length = latent_sequence_length + condition_sequence_length
    attention_mask = torch.zeros(batch_size, sequence_length, device=hidden_states.device, dtype=torch.bool)  # [B, N]
    effective_condition_sequence_length = encoder_attention_mask.sum(dim=1, dtype=torch.int)  # [B,]
    effective_sequence_length = latent_sequence_length + effective_condition_sequence_length

    if batch_size == 1:
        encoder_hidden_states = encoder_hidden_states[:, : effective_condition_sequence_length[0]]
        attention_mask = None
    else:
        for i in range(batch_size):
            attention_mask[i, : effective_sequence_length[i]] = True
        # [B, 1, 1, N], for broadcasting across attention heads
        attention_mask = attention_mask.unsqueeze(1).unsqueeze(1)

    for block in (*self.transformer_blocks, *self.single_transformer_blocks):
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            hidden_states, encoder_hidden_states = self._gradient_checkpointing_func(
                block, hidden_states, encoder_hidden_states, temb, attention_mask, image_rotary_emb
            )
        else:
            hidden_states, encoder_hidden_states = block(
                hidden_states, encoder_hidden_states, temb, attention_mask, image_rotary_emb
            )

    hidden_states = hidden_states[:, -original_context_length:]  # the plan's `keep` left the rank its kept rows
    hidden_states = self.norm_out(hidden_states, temb)
    hidden_states = self.proj_out(hidden_states)

    hidden_states = hidden_states.reshape(
        batch_size, post_patch_num_frames, post_patch_height, post_patch_width, -1, p_t, p, p
    )
    hidden_states = hidden_states.permute(0, 4, 1, 5, 2, 6, 3, 7)
    hidden_states = hidden_states.flatten(6, 7).flatten(4, 5).flatten(2, 3)

    if not return_dict:
        return (hidden_states,)
    return Transformer2DModelOutput(sample=hidden_states)


def install_framepack_forward(model, rule, pads, rank: int, cp: int, group=None) -> Restore:
    """Replace `model.forward` (a HunyuanVideoFramepackTransformer3DModel, checked in resolve) by `framepack_forward`
    on this rank's packed rows; `rule` is the plan's `ForwardRule` (its `pad`). `remove()` restores the class's."""
    cut = JointCut(rank, cp, pads, rule.pad is not None)

    def forward(self, *args, **kwargs):
        return framepack_forward(self, *args, cut=cut, **kwargs)

    model.forward = types.MethodType(forward, model)
    return Restore(model)
