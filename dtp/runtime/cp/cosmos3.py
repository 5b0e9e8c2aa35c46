"""Cosmos 3 Omni's forward with the cp cut moved before its packing (plan key `cp.forward: {name: cosmos3_omni}`).

diffusers' `Cosmos3OmniTransformer.forward` builds one packed, unbatched sequence in its own body: a zero buffer
[S, D] (`new_zeros`), the text embeddings written at `text_indexes`, the video patches projected (`proj_in`) with
their timestep embeddings (`time_embedder`, one row per noisy token) added by `scatter_add`, written at
`vision_sequence_indexes` (sound and action alike); then the mRoPE tables of the whole sequence, split at `und_len`
into the causal text prefix (`und_seq`) and the generation tokens (`gen_seq`). After the layers and the final norms
it joins the two pathways again and reads the predictions back by global index (`vision_mse_loss_indexes`) for
`proj_out`. Every one of those is whole-sequence sized on every rank ([27792, 4096] at 121 frames of 704 x 1280).

This copy of the forward builds only the rank's rows: each pathway is cut contiguously as a padded split cuts it
(`und_seq` padded `first`, `gen_seq` `last`: rank r holds prefix rows [r cu, (r + 1) cu) and generation rows
[r cg, (r + 1) cg), cu = ceil(und_len / cp), cg = ceil((S - und_len) / cp), the pad rows at the end of the last
ranks). Each local row knows its global row (`PackedRows.rows`), so each input's row for it is read through an index
map (`source`: global row -> the input's row, or -1): the text embedding, the projected patches, the timestep
embeddings and the RoPE tables are computed for the rank's L = cu + cg rows only, with shapes that do not depend on
the index values (the full-size check traces them on fake tensors). The read-back runs the output layers on the
rank's L rows ([L, 192]: the output's width, not the hidden's) and all-gathers those, then picks each prediction by
its owner rank and local row: an output-sized gather. The layers' exchanges are `runtime/cp/packed.py`'s.
Every other line is diffusers' forward (0.42.1); at cp = 1 it is diffusers' forward, bit for bit
(tests/unit/test_cp_cosmos3.py).

Rows a rank computes that the sequence does not put there (a text row's video projection, a pad row's RoPE) are
discarded by `torch.where`, never added: the kept rows are diffusers' values. Index maps [S] int64 stay whole (8
bytes a row, against the hidden state's 8192).
Example: 7 text + 18 video tokens, cp = 4: cu = 2, cg = 5 (L = 7); rank 3 holds text row 6 and one pad row, video
rows 15..17 (global 22..24) and two pad rows; the prediction of global row 24 is gathered row 3 * 7 + 2 + 2 = 25.
"""

from __future__ import annotations

import math
import types

import torch

from ...errors import ForwardError
from ...styles.collectives import all_gather_along
from .local_embed import Restore
from .sequence import dense


class PackedRows:
    """This rank's rows of the two pathways of one forward (module docstring); `pad` False: a pathway cp does not
    divide is a ForwardError. `cut(und_len, total)` sets them and records the pad slots in `pads`."""

    def __init__(self, rank: int, cp: int, pads, pad: bool, group=None):
        self.rank, self.cp, self.pads, self.pad, self.group = rank, cp, pads, pad, group
        self.und_len = self.und = self.gen = 0

    def cut(self, und_len: int, total: int) -> None:
        gen_len = total - und_len
        for name, n in (("und_seq", und_len), ("gen_seq", gen_len)):
            if not self.pad and n % self.cp:
                raise ForwardError(
                    f"cp split of Cosmos 3's {name}: {n} tokens are not divisible by the cp degree {self.cp}; use a "
                    f"plan whose cp.forward has `pad`."
                )
        self.und_len, self.und, self.gen = und_len, -(-und_len // self.cp), -(-gen_len // self.cp)
        self._record("first", self.und, und_len)
        self._record("last", self.gen, gen_len)

    def _record(self, slot_name: str, local: int, total: int) -> None:
        if self.pad and self.pads is not None:
            slot = self.pads.slots[slot_name]
            slot.local, slot.total = local, total
            slot.valid = max(0, min(local, total - self.rank * local))
            slot.padded = local * self.cp != total
            self.pads.names["und_seq" if slot_name == "first" else "gen_seq"] = slot_name

    @property
    def local(self) -> int:
        """L: the rank's rows, pad included (prefix rows first)."""
        return self.und + self.gen

    def rows(self, total: int, device) -> torch.Tensor:
        """`[L]` int64: the global row of each local row, -1 on pad rows."""
        position = torch.arange(self.local, device=device)
        prefix = position < self.und
        row = torch.where(
            prefix, self.rank * self.und + position, self.und_len + self.rank * self.gen + position - self.und
        )
        real = torch.where(prefix, row < self.und_len, row < total)
        return torch.where(real, row, -1)

    def source(self, index: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
        """`[L]` int64: for each local row, the position in `index` (global rows of an input's rows) of its row, or
        -1 when `index` does not name it (the map of diffusers' `hidden_states[index] = values`, last write kept)."""
        where = torch.full((total,), -1, dtype=torch.long, device=rows.device)
        where[index.to(rows.device)] = torch.arange(index.shape[0], device=rows.device)
        return torch.where(rows >= 0, where[rows.clamp(min=0)], -1)

    def slot(self, index: torch.Tensor) -> torch.Tensor:
        """For each global row of `index`: its row in the all-gather of every rank's L local rows (owner L + local)."""
        prefix = index < self.und_len
        gen = index - self.und_len
        und = max(self.und, 1)  # no prefix: no prefix rows to place (the branch is not taken)
        owner = torch.where(prefix, index // und, gen // self.gen if self.gen else 0)
        local = torch.where(prefix, index % und, self.und + (gen % self.gen if self.gen else 0))
        return owner * self.local + local

    def gather(self, local: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The rows of `index` (global rows) of an output computed on every rank's L rows (`[L, C]` here): one
        all-gather of [L, C], then each row picked from its owner's piece. cp = 1: `local[index]`."""
        if self.cp == 1:
            return local[index]
        return all_gather_along(dense(local), self.group, 0)[self.slot(index.to(local.device))]


def _noisy_index(self, noisy_frame_indexes, token_shapes, device) -> torch.Tensor:
    """diffusers' `_apply_timestep_embeds_to_noisy_tokens` index: the packed token of each timestep row, 1-D."""
    start_noisy_index = 0
    flattened_noisy_frame_indexes: list[torch.Tensor] = []
    for noisy_indexes_i, token_shape_i in zip(noisy_frame_indexes, token_shapes):
        spatial_numel_i = math.prod(token_shape_i[1:])
        spatial_indexes_i = torch.arange(spatial_numel_i, device=device)
        frame_offsets = (noisy_indexes_i * spatial_numel_i).unsqueeze(-1) + spatial_indexes_i + start_noisy_index
        flattened_noisy_frame_indexes.append(frame_offsets.flatten())
        start_noisy_index += token_shape_i[0] * spatial_numel_i
    return torch.cat(flattened_noisy_frame_indexes, dim=0)


def _with_timesteps(self, tokens, source, tokens_total, timesteps, noisy_frame_indexes, token_shapes, dtype):
    """The rank's projected tokens [L, D] (`source`: each local row's token, -1 none) plus the timestep embedding of
    the noisy ones: diffusers' `scatter_add` of `time_embedder(time_proj(t * scale))`, for the rank's rows only."""
    flat = _noisy_index(self, noisy_frame_indexes, token_shapes, tokens.device)
    noisy_of = torch.full((tokens_total,), -1, dtype=torch.long, device=tokens.device)
    noisy_of[flat] = torch.arange(flat.shape[0], device=tokens.device)
    noisy = torch.where(source >= 0, noisy_of[source.clamp(min=0)], -1)
    steps = timesteps.to(tokens.device)[noisy.clamp(min=0)] * self.config.timestep_scale
    time_embedder_dtype = next(self.time_embedder.parameters()).dtype
    embeds = self.time_embedder(self.time_proj(steps).to(time_embedder_dtype)).to(dtype)
    return torch.where((noisy >= 0).unsqueeze(-1), tokens + embeds, tokens)


def _place(hidden, values, source):
    """diffusers' `hidden_states[index] = values` on the rank's rows: the rows `source` names take `values`' rows."""
    return torch.where((source >= 0).unsqueeze(-1), values, hidden)


def cosmos3_omni_forward(
    self,
    input_ids: torch.Tensor,
    text_indexes: torch.Tensor,
    position_ids: torch.Tensor,
    und_len: int,
    sequence_length: int,
    vision_tokens: list[torch.Tensor],
    vision_token_shapes: list[tuple[int, int, int]],
    vision_sequence_indexes: torch.Tensor,
    vision_mse_loss_indexes: torch.Tensor,
    vision_timesteps: torch.Tensor,
    vision_noisy_frame_indexes: list[torch.Tensor],
    sound_tokens: list[torch.Tensor] | None = None,
    sound_token_shapes: list[tuple[int, int, int]] | None = None,
    sound_sequence_indexes: torch.Tensor | None = None,
    sound_mse_loss_indexes: torch.Tensor | None = None,
    sound_timesteps: torch.Tensor | None = None,
    sound_noisy_frame_indexes: list[torch.Tensor] | None = None,
    action_tokens: list[torch.Tensor] | None = None,
    action_token_shapes: list[tuple[int, int, int]] | None = None,
    action_sequence_indexes: torch.Tensor | None = None,
    action_mse_loss_indexes: torch.Tensor | None = None,
    action_timesteps: torch.Tensor | None = None,
    action_noisy_frame_indexes: list[torch.Tensor] | None = None,
    action_domain_ids: list[torch.Tensor] | None = None,
    return_dict: bool = True,
    *,
    cut: PackedRows,
):
    """`Cosmos3OmniTransformer.forward` on the rank's rows of each pathway (module docstring)."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformerOutput

    has_sound = sound_tokens is not None and sound_sequence_indexes is not None
    has_action = action_tokens is not None and action_sequence_indexes is not None

    # the rank's rows of the packed sequence, and each input's row for them (diffusers indexes the whole buffer)
    cut.cut(und_len, sequence_length)
    device = input_ids.device
    rows = cut.rows(sequence_length, device)

    # Embed text tokens into the rank's hidden_states rows.
    text = cut.source(text_indexes, rows, sequence_length)
    packed_text_embedding = self.embed_tokens(input_ids[text.clamp(min=0)])
    target_dtype = packed_text_embedding.dtype
    hidden_states = packed_text_embedding.new_zeros(size=(cut.local, self.config.hidden_size))
    hidden_states = _place(hidden_states, packed_text_embedding, text)
    del packed_text_embedding

    # Patchify + project the rank's vision latents, then add timestep embeddings to its noisy frames.
    packed_tokens_vision, original_latent_shapes = self._patchify_and_pack_latents(vision_tokens)
    vision = cut.source(vision_sequence_indexes, rows, sequence_length)
    tokens = self.proj_in(packed_tokens_vision[vision.clamp(min=0)])
    tokens = _with_timesteps(
        self, tokens, vision, packed_tokens_vision.shape[0], vision_timesteps, vision_noisy_frame_indexes,
        vision_token_shapes, target_dtype,
    )  # fmt: skip
    hidden_states = _place(hidden_states, tokens, vision)
    del packed_tokens_vision, tokens

    # Pack + project the rank's sound latents (when present); all sound frames are noisy.
    if has_sound:
        packed_tokens_sound = self._pack_sound_latents(sound_tokens, sound_token_shapes).to(target_dtype)
        sound = cut.source(sound_sequence_indexes, rows, sequence_length)
        tokens = self.audio_proj_in(packed_tokens_sound[sound.clamp(min=0)]) + self.audio_modality_embed
        tokens = _with_timesteps(
            self, tokens, sound, packed_tokens_sound.shape[0], sound_timesteps, sound_noisy_frame_indexes,
            sound_token_shapes, target_dtype,
        )  # fmt: skip
        hidden_states = _place(hidden_states, tokens, sound)
        del packed_tokens_sound, tokens

    # Pack + project the rank's action latents (when present). Domain ids select the action head weights.
    if has_action:
        packed_tokens_action, per_token_domain_ids = self._pack_action_latents(
            action_tokens, action_token_shapes, action_domain_ids
        )
        packed_tokens_action = packed_tokens_action.to(target_dtype)
        action = cut.source(action_sequence_indexes, rows, sequence_length)
        mine = action.clamp(min=0)
        per_token_domain_ids = per_token_domain_ids.to(device=packed_tokens_action.device)[mine]
        tokens = self.action_proj_in(packed_tokens_action[mine], per_token_domain_ids)
        tokens = tokens + self.action_modality_embed
        if action_mse_loss_indexes.numel() > 0:
            tokens = _with_timesteps(
                self, tokens, action, packed_tokens_action.shape[0], action_timesteps, action_noisy_frame_indexes,
                action_token_shapes, target_dtype,
            )  # fmt: skip
        hidden_states = _place(hidden_states, tokens, action)
        del packed_tokens_action, tokens

    # Rotary embeddings of the rank's rows (pad rows zero, as a padded split of the whole tables made them).
    positions = position_ids.to(device)[..., rows.clamp(min=0)]
    cos, sin = self.rotary_emb(
        position_ids=positions.unsqueeze(0) if positions.ndim == 1 else positions.unsqueeze(1),
        device=hidden_states.device,
        dtype=hidden_states.dtype,
    )
    real = (rows >= 0).unsqueeze(-1)
    cos = torch.where(real, cos.squeeze(0), 0)
    sin = torch.where(real, sin.squeeze(0), 0)

    und_seq = hidden_states[: cut.und]
    gen_seq = hidden_states[cut.und :]
    rotary_emb = (cos[: cut.und], sin[: cut.und], cos[cut.und :], sin[cut.und :])

    und_out, gen_out = self._run_decoder_stack(und_seq, gen_seq, rotary_emb)
    last_hidden_state = torch.cat([und_out, gen_out], dim=0)  # the rank's L rows
    del und_seq, gen_seq, hidden_states, und_out, gen_out

    # Decode vision predictions: proj_out on the rank's rows, the predictions gathered by owner and local row.
    preds_vision_packed = cut.gather(self.proj_out(last_hidden_state), vision_mse_loss_indexes)
    preds_vision = self._unpatchify_and_unpack_latents(
        preds_vision_packed,
        token_shapes_vision=vision_token_shapes,
        noisy_frame_indexes_vision=vision_noisy_frame_indexes,
        original_latent_shapes=original_latent_shapes,
    )

    preds_sound: list[torch.Tensor] | None = None
    if has_sound:
        preds_sound_packed = cut.gather(self.audio_proj_out(last_hidden_state), sound_mse_loss_indexes)
        preds_sound = self._unpack_sound_latents(preds_sound_packed, sound_token_shapes, sound_noisy_frame_indexes)

    preds_action: list[torch.Tensor] | None = None
    if has_action:
        per_noisy_domain_ids = [
            domain_id.reshape(1).expand(len(noisy_idxs))
            for domain_id, noisy_idxs in zip(action_domain_ids, action_noisy_frame_indexes)
        ]
        per_noisy_domain_ids = torch.cat(per_noisy_domain_ids, dim=0).to(device=last_hidden_state.device)
        if action_mse_loss_indexes.numel() > 0:
            # each local row's head: the domain of the prediction read from it (rows read by none take the first's)
            read = cut.source(action_mse_loss_indexes, rows, sequence_length)
            local = self.action_proj_out(last_hidden_state, per_noisy_domain_ids[read.clamp(min=0)])
            preds_action_packed = cut.gather(local, action_mse_loss_indexes)
        else:  # no noisy action token: diffusers' empty read-back
            preds_action_packed = self.action_proj_out(last_hidden_state[:0], per_noisy_domain_ids)
        preds_action = self._unpack_action_latents(preds_action_packed, action_token_shapes, action_noisy_frame_indexes)

    if not return_dict:
        return preds_vision, preds_sound, preds_action

    return Cosmos3OmniTransformerOutput(sample=preds_vision, sound=preds_sound, action=preds_action)


def install_cosmos3_omni_forward(model, rule, pads, rank: int, cp: int, group=None) -> Restore:
    """Replace `model.forward` (a Cosmos3OmniTransformer, checked in resolve) by `cosmos3_omni_forward` on this
    rank's rows; `rule` is the plan's `ForwardRule` (its `pad`), `group` the cp group of the read-back's all-gather.
    `remove()` restores the class's forward."""
    cut = PackedRows(rank, cp, pads, rule.pad is not None, group)

    def forward(self, *args, **kwargs):
        return cosmos3_omni_forward(self, *args, cut=cut, **kwargs)

    model.forward = types.MethodType(forward, model)
    return Restore(model)
