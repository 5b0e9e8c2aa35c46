"""A patch embedding that computes the rank's tokens only, though the forward flattens its output itself (a split
rule's `embed`, `plan.cp.SplitRule`): the input side of `grid.py`.

Kandinsky 5 / 6 SR embed the channels-last latents [B, F pt, H ph, W pw, C] to the token grid [B, F, H, W, D], read
its shape (the RoPE tables, the grid to restore at the end), flatten it themselves (raster; 6 SR into 64-token
blocks) and hand it to the first block, whose split hook cuts the rank's rows. The whole embedded grid stays alive
as the forward's local variable through the first block (Kandinsky 5 at cp=8: 0.195 GB of 0.502 GB per rank). Here:

1. The embedding's forward (replaced under CP) keeps its input and returns the grid of token indices instead,
   [B, F, H, W, 1] int64 (F H W integers in memory: a zero-stride view along B); its shape is the embedded grid's
   but for the channels. The forward flattens it (the token order, whatever it is) as it would the tokens.
2. The first block's split cuts the flattened indices like tokens: the rank's [B, n, 1] grid positions.
3. `EmbedRows`, a pre-hook on that block after the split, embeds those positions: the embedding's own patchify
   (view, permute, flatten: the same per-token patch vector) on the kept input, the rank's rows taken by index,
   then its `in_layer`: the rank's tokens [B, n, D], as the whole embedding would give them (a Linear is per token).

Kandinsky 6 adds per-frame token types to the embedded grid in its forward (`+ types[:, :, None, None, :]`): with
`per_frame`, the table's module keeps its [B, F, D] output and hands the forward int64 zeros [B, F, 1], so the sum is
the indices again, and `EmbedRows` adds each rank token's frame row (token index // (H W)). Any other computation
on the embedded grid before the first block would compute on the indices: int64 + a float tensor is a float tensor,
which `EmbedRows` refuses (ForwardError).

Wan 2.2 Animate embeds channels-first latents with a Conv3d (`conv_embed.py`: the grid [B, 1, F, H, W]) and adds a
second embedding, the pose, into the grid's last frames (`hidden_states[:, :, 1:] = hidden_states[:, :, 1:] + pose`)
before it flattens: with `added`, that embedding keeps its input and hands the forward the codes S (1 + a), a its own
raster index and S the embedded grid's token count, so the sum is S (1 + a) + t for a token t that got pose row a, t
alone for one that got none; `EmbedRows` decodes each rank token's (t, a), embeds both and adds them where a >= 0:
whatever slice the forward added into, read from the sum, no offset in the plan. The whole embedded video (and the
pose grid, and the flattened copy the forward makes) is never built: Wan Animate at cp=8 held them on every rank.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ...errors import ForwardError
from ..arguments import Binder
from .conv_embed import conv_grid, conv_index_grid, conv_rows


def patches(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The embedding's patch vectors of `x` [B, F pt, H ph, W pw, C], flattened in raster order: [B, F H W, K]
    (`resolve.binding.cp.EMBED_CLASSES`: the classes whose forward is `in_layer` of exactly these)."""
    batch, duration, height, width, channels = x.shape
    p_t, p_h, p_w = module.patch_size
    x = x.view(batch, duration // p_t, p_t, height // p_h, p_h, width // p_w, p_w, channels)
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).flatten(4, 7).flatten(1, 3)


def embed_rows(module: nn.Module, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The embedding's tokens at raster positions `index` [n] of its input `x`: [B, n, D]."""
    if isinstance(module, nn.Conv3d):
        return conv_rows(module, x, index)
    return module.in_layer(patches(module, x).index_select(1, index))


def decode(codes: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token t, added row a) of the codes S (1 + a) + t of an `added` sum, S = `count`; a = -1 where the forward
    added nothing. S = 12: codes [5, 17, 41] -> tokens [5, 5, 5], rows [-1, 0, 2]."""
    return codes % count, codes // count - 1


class EmbedState:
    """This forward's embedding input and grid (F, H, W), the per-frame table's output and the added embedding's input
    when they ran (kept by the replaced forwards, read once by `EmbedRows`)."""

    def __init__(self):
        self.reset()

    def reset(self, *unused) -> None:
        self.input, self.grid, self.table, self.added = None, None, None, None


class EmbedRows:
    """Pre-hook on the first block, after its split: the rank's grid positions in, their embedded tokens out."""

    def __init__(self, path: str, block: nn.Module, rule, embed: nn.Module, state: EmbedState, added=None):
        self.path, self.rule, self.embed, self.state, self.added_module = path, rule, embed, state, added
        self.binder = Binder(block.forward)

    def __call__(self, module, args, kwargs):
        return self.binder.map_argument(args, kwargs, self.rule.name, self._rows)

    def _rows(self, index) -> torch.Tensor:
        state = self.state
        x, grid, table, added = state.input, state.grid, state.table, state.added
        state.input, state.table, state.added = None, None, None  # read once: nothing whole held past the first block
        if x is None:
            raise ForwardError(f"cp split at '{self.path}': '{self.rule.embed}' did not run in this forward.")
        if not (isinstance(index, torch.Tensor) and index.dtype == torch.int64 and index.ndim == 3):
            got = tuple(index.shape) if isinstance(index, torch.Tensor) else type(index).__name__
            raise ForwardError(
                f"cp split at '{self.path}': input '{self.rule.name}' must be the rank's token indices [B, n, 1] "
                f"(int64) that '{self.rule.embed}' handed the forward, got {got}: the forward computes on the "
                f"embedded grid before '{self.path}', so the embedding cannot run per rank; drop the split's `embed`."
            )
        index = index[0, :, 0]
        if self.added_module is not None:  # codes S (1 + a) + t: token t, added row a (-1: none)
            return self._with_added(x, index, grid[0] * grid[1] * grid[2], added)
        rows = embed_rows(self.embed, x, index)
        if table is None:  # no per-frame table, or the forward did not call it (Kandinsky 6 without token types)
            return rows
        return rows + table.index_select(1, index // (grid[1] * grid[2]))

    def _with_added(self, x, codes, count: int, added) -> torch.Tensor:
        token, row = decode(codes, count)
        rows = embed_rows(self.embed, x, token)
        if added is None:  # the forward did not call the added embedding
            return rows
        extra = embed_rows(self.added_module, added, row.clamp(min=0))
        return rows + torch.where((row >= 0)[None, :, None], extra, torch.zeros((), dtype=extra.dtype))


class _Restore:
    """A hook-handle look-alike: `remove()` drops the instance's forward, so the class's runs again."""

    def __init__(self, module: nn.Module):
        self.module = module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def index_grid(state: EmbedState):
    """The embedding's forward under CP: keep the input, return the grid of token indices [B, F, H, W, 1] (a Conv3d
    patchifier's: [B, 1, F, H, W], its own layout but for the channels)."""

    def forward(self, x):
        if isinstance(self, nn.Conv3d):  # channels-first [B, C, F, H, W] -> [B, 1, F, H, W]
            state.input, state.grid = x, conv_grid(self, x)
            return conv_index_grid(x, state.grid)
        batch, duration, height, width, _ = x.shape
        grid = tuple(n // p for n, p in zip((duration, height, width), self.patch_size))
        state.input, state.grid = x, grid
        return torch.arange(grid[0] * grid[1] * grid[2], device=x.device).view(1, *grid, 1).expand(batch, *grid, 1)

    return forward


def zero_table(state: EmbedState, whole):
    """The per-frame table's forward under CP: keep its [B, F, D] output, return int64 zeros [B, F, 1]."""

    def forward(self, *args, **kwargs):
        state.table = whole(self, *args, **kwargs)
        return torch.zeros(*state.table.shape[:-1], 1, dtype=torch.int64, device=state.table.device)

    return forward


def added_grid(state: EmbedState):
    """The added embedding's forward under CP: keep its input, return the codes S (1 + its raster index) [B, 1, F, H,
    W] (S: the embedded grid's tokens, so the embedding must have run first)."""

    def forward(self, x):
        if state.grid is None:
            raise ForwardError("cp embed: the `added` embedding ran before the `embed` one in this forward.")
        state.added = x
        count = state.grid[0] * state.grid[1] * state.grid[2]
        return conv_index_grid(x, conv_grid(self, x), scale=count, offset=count)

    return forward


def install_embeds(model: nn.Module, embeds) -> list:
    """For every `(block path, embedding path, SplitRule)`: the embedding returns the index grid, the block embeds
    its rank's indices (register after the block's split hook). Returns the handles."""
    handles = []
    for path, embed_path, rule in embeds:
        state, embed = EmbedState(), model.get_submodule(embed_path)
        handles.append(model.register_forward_pre_hook(state.reset))
        handles.append(model.register_forward_hook(state.reset, always_call=True))
        embed.forward = types.MethodType(index_grid(state), embed)
        handles.append(_Restore(embed))
        if rule.per_frame is not None:
            table = model.get_submodule(rule.per_frame)
            table.forward = types.MethodType(zero_table(state, type(table).forward), table)
            handles.append(_Restore(table))
        added = None if rule.added is None else model.get_submodule(rule.added)
        if added is not None:
            added.forward = types.MethodType(added_grid(state), added)
            handles.append(_Restore(added))
        block = model.get_submodule(path)
        hook = EmbedRows(path, block, rule, embed, state, added)
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    return handles
