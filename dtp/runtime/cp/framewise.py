"""A per-frame module of a video model (its frames in the batch dim) cut to the rank's tokens of each sample.

Allegro embeds its video frame by frame: `pos_embed` (diffusers' `PatchEmbed`) runs on [B x F, C, H, W] and returns
[B x F, P, D]; the forward then makes each sample's tokens frame-major with `unflatten(0, (B, -1)).flatten(1, 2)`
([B, F x P, D], S = F x P). A plan cut at the first block's input keeps the whole embedded video alive on every rank
until block 0 has run (0.365 GB at cp=8, 85 frames of 720 x 1280: ratio 1.59). The split rule `frames_of: NAME` on the
module's output (`SplitRule.frames_of`) says the output's rows are the F frames of each of the B samples of the model's
input NAME (B = its dim 0, recorded by a model pre-hook, `Samples`): rank r keeps tokens [r S / cp, (r + 1) S / cp) of
each sample, returned [B, S / cp, D], which the caller's reshape keeps as it is ([B, 1, S / cp, D] flattened back).

For `PatchEmbed` the cut is made as the module runs (`patch_embed_frames`): only the frames the rank's tokens touch
are projected, so no rank holds the whole embedded video. Any other module's output is cut after the fact
(`SplitFrames`). Example: B = 1, F = 22 frames of P = 3600 patches, cp = 8: rank 1 keeps tokens 9900..19799, frames 2..5
of which it projects (4 of 22), and returns [1, 9900, D].
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ...errors import ForwardError
from ..arguments import Binder
from .local_embed import Restore, token_range, whole_pos_embed
from .sequence import own_chunk


class Samples:
    """The batch size of the model's inputs named by `frames_of` rules, recorded by a model forward pre-hook."""

    def __init__(self, model: nn.Module, names):
        self.binder = Binder(model.forward)
        self.names = tuple(dict.fromkeys(names))
        self.batch: dict[str, int] = {}

    def record(self, module, args, kwargs) -> None:
        self.batch.clear()
        arguments = None if self.binder.exact else self.binder.arguments(args, kwargs)
        for name in self.names:
            value = self.binder.get(args, kwargs, name) if arguments is None else arguments.get(name)
            if isinstance(value, torch.Tensor) and value.ndim:
                self.batch[name] = value.shape[0]

    def of(self, name: str, what: str) -> int:
        if name not in self.batch:
            raise ForwardError(f"cp split of {what}: the model's input '{name}' (dim 0: the batch) was not given.")
        return self.batch[name]


def _frames(rows: int, batch: int, what: str) -> int:
    if rows % batch:
        raise ForwardError(f"cp split of {what}: {rows} rows are not the frames of {batch} samples (dim 0).")
    return rows // batch


def frames_chunk(x: torch.Tensor, batch: int, rank: int, cp: int, what: str) -> torch.Tensor:
    """[B x F, P, D] -> this rank's [B, S / cp, D] of each sample's frame-major F x P tokens (a copy)."""
    if x.ndim != 3:
        raise ForwardError(f"cp split of {what}: expected a [B x F, P, D] tensor, got shape {tuple(x.shape)}.")
    frames = _frames(x.shape[0], batch, what)
    return own_chunk(x.unflatten(0, (batch, frames)).flatten(1, 2), 1, rank, cp, what)


def patch_embed_frames(module, latent, *, batch: int, rank: int, cp: int, what: str) -> torch.Tensor:
    """diffusers' `PatchEmbed.forward` on [B x F, C, H, W] for this rank's tokens of each sample only (module
    docstring): the touched frames projected, the rank's rows copied out, then the per-token norm and position sum."""
    frames = _frames(latent.shape[0], batch, what)
    if module.pos_embed_max_size is not None:
        height, width = latent.shape[-2:]
    else:
        height, width = latent.shape[-2] // module.patch_size, latent.shape[-1] // module.patch_size
    per_frame = (latent.shape[-2] // module.patch_size) * (latent.shape[-1] // module.patch_size)
    start, stop = token_range(frames * per_frame, rank, cp, what)
    first, last = start // per_frame, -(-stop // per_frame)  # the frames the rank's tokens touch
    touched = latent.unflatten(0, (batch, frames))[:, first:last].flatten(0, 1)
    tokens = module.proj(touched).flatten(2).transpose(1, 2)  # [B x touched, P, D]
    tokens = tokens.unflatten(0, (batch, last - first)).flatten(1, 2)
    offset = first * per_frame
    tokens = tokens[:, start - offset : stop - offset].clone(memory_format=torch.contiguous_format)
    if module.layer_norm:
        tokens = module.norm(tokens)
    if module.pos_embed is None:
        return tokens
    index = torch.arange(start, stop, device=tokens.device) % per_frame
    pos_embed = whole_pos_embed(module, height, width, tokens.device)[:, index]
    return (tokens + pos_embed).to(tokens.dtype)


class SplitFrames:
    """Forward hook: output 0 ([B x F, P, D]) replaced by the rank's [B, S / cp, D] (`frames_chunk`)."""

    def __init__(self, path: str, rule, samples: Samples, rank: int, cp: int, pads=None):
        self.path, self.rule, self.samples, self.rank, self.cp, self.pads = path, rule, samples, rank, cp, pads

    def __call__(self, module, args, output):
        what = f"output 0 of '{self.path}'"
        if not isinstance(output, torch.Tensor):
            raise ForwardError(f"cp split of {what}: a `frames_of` split cuts a bare tensor output.")
        chunk = frames_chunk(output, self.samples.of(self.rule.frames_of, what), self.rank, self.cp, what)
        if self.pads is not None:
            self.pads.note(self.path, 0, output.unflatten(0, (chunk.shape[0], -1)).flatten(1, 2), chunk, 1)
        return chunk


def install_frames(module: nn.Module, path: str, rule, samples: Samples, rank: int, cp: int, pads=None):
    """The rank's tokens of a `frames_of` split: `PatchEmbed` computes only them, any other module's output is cut
    (`SplitFrames`). Returns the handle that undoes it."""
    if type(module).__name__ == "PatchEmbed" and module.flatten:
        what = f"output 0 of '{path}'"

        def forward(self, latent):
            return patch_embed_frames(self, latent, batch=samples.of(rule.frames_of, what), rank=rank, cp=cp, what=what)

        module.forward = types.MethodType(forward, module)
        return Restore(module)
    return module.register_forward_hook(SplitFrames(path, rule, samples, rank, cp, pads))
