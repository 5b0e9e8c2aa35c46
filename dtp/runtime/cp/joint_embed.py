"""A joint [text | video] embedding cut to [the whole text | this rank's video tokens] as it is computed.

ConsisID (and CogVideoX) embed text and video in one module, `CogVideoXPatchEmbed(text, video)` -> cat([text, video])
[B, T + S, D]; the forward then takes `[:, :T]` as the text and `[:, T:]` as the video, T the text input's length.
Cut at the first block's input, the whole joint output lives on every rank until block 0 has run (ConsisID at cp=8,
49 frames of 480 x 720: 0.109 GB, with the patch projection's whole output before it). The split rule `skip: NAME` on
the module's output (`SplitRule.skip`) says its first rows along `dim`, as many as the module's input NAME has, pass
whole, and only the rest is cut (zero-padded with `pad`, recorded in `PadState` as an input split would be): the
forward's own slices then give the whole text (cut at block 0 as before) and the rank's video chunk.

For `CogVideoXPatchEmbed` the cut is made as the module runs (`cogvideox_patch_embed`): only the frames the rank's
video tokens touch are projected. Any other module's output is cut after the fact (`SplitSkip`). Example: T = 226,
13 frames of 30 x 45 = 17550 video tokens, cp = 8: chunks of 2194 (17552 padded); rank 7 projects frames 11..12 and
returns [1, 226 + 2194, D], its last 2 rows zeros (pad).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ...errors import ForwardError
from ..arguments import Binder
from .local_embed import Restore, token_range
from .sequence import padded_chunk


def _record(pads, path: str, rule, cp: int, local: int, valid: int, total: int) -> None:
    """The cut rows in `pads`, as `SplitInputs` records a padded (or plain) input split: their length a rank and whole
    (`PadState.lengths`, what a `keep` reads), and with `pad` the padded sequence's slot."""
    pads.lengths[f"{path}.{rule.name}"] = (local, total)
    if rule.pad is not None:
        slot = pads.slots[rule.pad.at]
        slot.local, slot.valid, slot.total = local, valid, total
        slot.padded = local * cp != total


def _range(total: int, rank: int, cp: int, padded: bool, what: str) -> tuple[int, int, int]:
    """(start, stop, local): this rank's real video rows [start, stop) and its chunk length (pad included)."""
    if not padded:
        start, stop = token_range(total, rank, cp, what)
        return start, stop, stop - start
    local = -(-total // cp)
    start = min(rank * local, total)
    return start, min(start + local, total), local


def _video_tokens(module, video: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """`CogVideoXPatchEmbed`'s video tokens [start, stop) of [B, F, C, H, W] (diffusers' two patchings)."""
    batch, frames, channels, height, width = video.shape
    p = module.patch_size
    if stop == start:  # a rank holding pad rows only
        width_out = module.proj.out_channels if module.patch_size_t is None else module.proj.out_features
        return video.new_zeros(batch, 0, width_out)
    if module.patch_size_t is None:
        per_frame = (height // p) * (width // p)
        first, last = start // per_frame, -(-stop // per_frame)
        touched = video[:, first:last].reshape(-1, channels, height, width)
        tokens = module.proj(touched)
        tokens = tokens.view(batch, last - first, *tokens.shape[1:]).flatten(3).transpose(2, 3).flatten(1, 2)
        return tokens[:, start - first * per_frame : stop - first * per_frame]
    p_t = module.patch_size_t
    patches = video.permute(0, 1, 3, 4, 2).reshape(batch, frames // p_t, p_t, height // p, p, width // p, p, channels)
    patches = patches.permute(0, 1, 3, 5, 7, 2, 4, 6).flatten(4, 7).flatten(1, 3)
    return module.proj(patches[:, start:stop])


def _positions(module, text: int, start: int, stop: int, frames: int, height: int, width: int, device):
    """Rows [0, text) and text + [start, stop) of diffusers' joint position table, or None without one."""
    if not (module.use_positional_embeddings or module.use_learned_positional_embeddings):
        return None
    if module.use_learned_positional_embeddings and (module.sample_width != width or module.sample_height != height):
        raise ForwardError("CogVideoX patch embedding: learned positions exist for the default resolution only.")
    pre_compression = (frames - 1) * module.temporal_compression_ratio + 1
    table = module.pos_embedding
    if (module.sample_height, module.sample_width, module.sample_frames) != (height, width, pre_compression):
        table = module._get_positional_embeddings(height, width, pre_compression, device=device)
    return torch.cat([table[:, :text], table[:, text + start : text + stop]], dim=1)


def cogvideox_patch_embed(module, text_embeds, image_embeds, *, rule, pads, path: str, rank: int, cp: int, what: str):
    """diffusers' `CogVideoXPatchEmbed.forward` giving [the whole text | the rank's video chunk] (module docstring)."""
    text = module.text_proj(text_embeds)
    batch, frames, _, height, width = image_embeds.shape
    p, p_t = module.patch_size, module.patch_size_t or 1
    total = (frames // p_t) * (height // p) * (width // p)
    start, stop, local = _range(total, rank, cp, rule.pad is not None, what)
    video = _video_tokens(module, image_embeds, start, stop)
    rows = [text, video]
    if local > stop - start:  # this rank's pad rows
        rows.append(video.new_zeros(batch, local - (stop - start), video.shape[-1]))
    embeds = torch.cat(rows, dim=1).contiguous()
    positions = _positions(module, text.shape[1], start, stop, frames, height, width, embeds.device)
    if positions is not None:
        positions = positions.to(dtype=embeds.dtype)
        real = text.shape[1] + stop - start
        embeds = torch.cat([embeds[:, :real] + positions, embeds[:, real:]], dim=1)
    _record(pads, path, rule, cp, local, stop - start, total)
    return embeds


class SplitSkip:
    """Forward hook (with kwargs): output 0 = [its first rows, as long as input `rule.skip`, whole | the rest cut]."""

    def __init__(self, path: str, module: nn.Module, rule, pads, rank: int, cp: int):
        self.path, self.rule, self.pads, self.rank, self.cp = path, rule, pads, rank, cp
        self.binder = Binder(module.forward)

    def __call__(self, module, args, kwargs, output):
        what = f"output 0 of '{self.path}'"
        head = self.binder.arguments(args, kwargs).get(self.rule.skip)
        if not isinstance(output, torch.Tensor) or not isinstance(head, torch.Tensor):
            raise ForwardError(f"cp split of {what}: a `skip` split needs a tensor output and '{self.rule.skip}'.")
        dim, skip = self.rule.dim, head.shape[self.rule.dim]
        rest = output.narrow(dim, skip, output.shape[dim] - skip)
        if self.rule.pad is not None:
            chunk, valid = padded_chunk(rest, dim, self.rank, self.cp, what)
        else:
            start, stop = token_range(rest.shape[dim], self.rank, self.cp, what)
            chunk, valid = rest.narrow(dim, start, stop - start), stop - start
        _record(self.pads, self.path, self.rule, self.cp, chunk.shape[dim], valid, rest.shape[dim])
        return torch.cat([output.narrow(dim, 0, skip), chunk], dim=dim)


def install_skip(module: nn.Module, path: str, rule, pads, rank: int, cp: int):
    """The rank's rows of a `skip` split: `CogVideoXPatchEmbed` computes only them, any other module's output is cut
    (`SplitSkip`). Returns the handle that undoes it."""
    what = f"output 0 of '{path}'"
    if type(module).__name__ == "CogVideoXPatchEmbed" and rule.skip == "text_embeds" and rule.dim == 1:
        local = dict(rule=rule, pads=pads, path=path, rank=rank, cp=cp, what=what)

        def forward(self, text_embeds, image_embeds):
            return cogvideox_patch_embed(self, text_embeds, image_embeds, **local)

        module.forward = types.MethodType(forward, module)
        return Restore(module)
    return module.register_forward_hook(SplitSkip(path, module, rule, pads, rank, cp), with_kwargs=True)
