"""The tokens stay cut through the forward's own reshape to the token grid: the output layer runs on the rank's rows and
its patch grid is gathered in grid order (a plan's `cp.grid`, `plan.cp.GridRule`).

Kandinsky 5 / 6 / 6 SR flatten the channels-last token grid themselves before the blocks and reshape the blocks'
output back to it ([B, F, H, W, D], outside any module) for the output layer, a LayerNorm and modulation in fp32,
then a Linear to each token's patch. A gather at the last block makes every rank run that layer on the whole
sequence (the per-rank peak: three fp32 copies of [B, S, D]). Here instead:

1. `HoldTokens`, a forward hook on the last block, keeps the rank's rows [B, n, D] and hands the forward a stand-in:
   the token indices 0..S-1 as [B, S, 1] int64 (a zero-stride view along B: S integers in memory). The forward's
   reshape / permute of it is the grid of indices [B, F, H, W, 1], whatever order it flattened the tokens in
   (raster for Kandinsky 5 / 6; NABLA's 64-token blocks for 6 SR, whose `_local_merge` reorders them).
2. `GridInput`, a pre-hook on the output layer, reads that grid (the token at each grid position, F-major) and hands
   the layer the rank's rows as a grid of one row, [B, 1, 1, n, D]: per token, so each row's output is exact.
3. `GridOutput`, a forward hook on the output layer, takes its output [B, p0, p1, n p2, C] (token t's patch at
   [:, :, :, t p2 : (t + 1) p2]), all-gathers the rows' patches [B, n, p0, p1, p2, C] in rank order (token order),
   drops pad rows (`trim`), puts the tokens in grid order (`index_select` by the grid of indices) and lays the
   patches out as the layer does for a whole grid: [B, F p0, H p1, W p2, C].

What travels is the layer's output (C p0 p1 p2 values a token: 64 for Kandinsky 5), not the [B, S, D] hidden states.
Any arithmetic of the forward on the stand-in between the two modules would be wrong: the stand-in is int64 [.., 1]
so that such a forward fails loudly, and `GridInput` refuses anything but an int64 grid of S indices.
Example: 2 frames of 2 x 3 tokens (S = 12), cp = 2, patch (1, 2, 2): rank 1 runs the layer on tokens 6..11 as
[B, 1, 1, 6, D] -> [B, 1, 2, 12, C]; after the gather token 6 (frame 1, row 0, column 0) lands at [:, 1, 0:2, 0:2].
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import ForwardError
from ..arguments import Binder
from .hooks import PadState
from .sequence import gather_chunks


class GridState:
    """This forward's held rows (`rows`, [B, n, D]; `n` of them), the whole unpadded token count, and the grid's
    token order and (F, H, W) shape. Reset before and after every model forward (nothing held between calls)."""

    def __init__(self):
        self.reset()

    def reset(self, *unused) -> None:
        self.rows, self.n, self.total, self.order, self.shape = None, 0, 0, None, None


class HoldTokens:
    """Forward hook on the `tokens` module: keep the rank's rows, return the index stand-in (module docstring)."""

    def __init__(self, path: str, rule, cp: int, pads: PadState, state: GridState):
        self.path, self.rule, self.cp, self.pads, self.state = path, rule, cp, pads, state

    def __call__(self, module, args, output):
        i = self.rule.element
        x = output if i is None else (output[i] if isinstance(output, tuple) and i < len(output) else None)
        if not isinstance(x, torch.Tensor) or x.ndim != 3:
            where = "output" if i is None else f"output element {i}"
            raise ForwardError(f"cp grid: the {where} of '{self.path}' must be the rank's tokens [B, n, D].")
        total = x.shape[1] * self.cp
        slot = self.pads.slots[self.rule.trim] if self.rule.trim is not None else None
        if slot is not None and slot.padded:
            total = slot.total
        self.state.rows, self.state.total = x, total
        stand_in = torch.arange(total, device=x.device).view(1, total, 1).expand(x.shape[0], total, 1)
        return stand_in if i is None else output[:i] + (stand_in,) + output[i + 1 :]


class GridInput:
    """Pre-hook on the output layer: the grid of indices in, the rank's rows as [B, 1, 1, n, D] out."""

    def __init__(self, path: str, module: nn.Module, rule, state: GridState):
        self.path, self.rule, self.state = path, rule, state
        self.binder = Binder(module.forward)

    def __call__(self, module, args, kwargs):
        return self.binder.map_argument(args, kwargs, self.rule.input, self._rows)

    def _rows(self, grid) -> torch.Tensor:
        state = self.state
        if state.rows is None:
            raise ForwardError(f"cp grid at '{self.path}': '{self.rule.tokens}' did not run in this forward.")
        if not (isinstance(grid, torch.Tensor) and grid.dtype == torch.int64 and grid.ndim == 5):
            got = tuple(grid.shape) if isinstance(grid, torch.Tensor) else type(grid).__name__
            raise ForwardError(
                f"cp grid at '{self.path}': input '{self.rule.input}' must be the forward's grid of the token indices "
                f"'{self.rule.tokens}' returned ([B, F, H, W, 1] int64), got {got}: the forward computes on the tokens "
                f"between the two modules, so they cannot stay cut there; use a `gather` at '{self.rule.tokens}'."
            )
        if grid.shape[-1] != 1 or grid[0].numel() != state.total:
            raise ForwardError(
                f"cp grid at '{self.path}': the grid {tuple(grid.shape)} does not hold the {state.total} tokens."
            )
        state.order, state.shape = grid[0, ..., 0].reshape(-1), tuple(grid.shape[1:4])
        rows, state.rows, state.n = state.rows, None, state.rows.shape[1]
        return rows.unsqueeze(1).unsqueeze(1)


def token_patches(output: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """The output layer's output for n tokens laid out as a grid of one row, [B, p0, p1, n p2, C], as the tokens'
    patches [B, n, p0, p1, p2, C] (token t's patch is columns [t p2, (t + 1) p2))."""
    if output.ndim != 5 or output.shape[3] % n:
        raise ForwardError(f"cp grid: the {what} {tuple(output.shape)} is not a patch grid [B, p0, p1, n p2, C].")
    batch, p0, p1, width, channels = output.shape
    return output.reshape(batch, p0, p1, n, width // n, channels).permute(0, 3, 1, 2, 4, 5)


def patch_grid(patches: torch.Tensor, order: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Every token's patch [B, S, p0, p1, p2, C] (token order) laid out as the output layer lays out a whole grid:
    [B, F p0, H p1, W p2, C], the token at grid position (f, h, w) being `order[(f H + h) W + w]`."""
    batch, _, p0, p1, p2, channels = patches.shape
    frames, height, width = shape
    grid = patches.index_select(1, order).reshape(batch, frames, height, width, p0, p1, p2, channels)
    return grid.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(batch, frames * p0, height * p1, width * p2, channels)


class GridOutput:
    """Forward hook on the output layer: its patches of the rank's rows gathered, in grid order (module docstring)."""

    def __init__(self, path: str, group, state: GridState):
        self.path, self.group, self.state = path, group, state

    def __call__(self, module, args, output):
        state, what = self.state, f"output of '{self.path}'"
        if not isinstance(output, torch.Tensor) or state.order is None:
            raise ForwardError(f"cp grid: the {what} must be a tensor, after '{self.path}' got the rank's rows.")
        patches = token_patches(output, state.n, what)
        whole = gather_chunks(patches, 1, self.group, what).narrow(1, 0, state.total)
        order, state.order = state.order, None
        return patch_grid(whole, order, state.shape)


def install_grids(model: nn.Module, grids, pads: PadState, group, cp: int) -> list:
    """Hook every `(layer path, tokens path, GridRule)`; returns the handles."""
    handles = []
    for path, tokens, rule in grids:
        state = GridState()
        handles.append(model.register_forward_pre_hook(state.reset))
        handles.append(model.register_forward_hook(state.reset, always_call=True))
        handles.append(model.get_submodule(tokens).register_forward_hook(HoldTokens(tokens, rule, cp, pads, state)))
        layer = model.get_submodule(path)
        handles.append(layer.register_forward_pre_hook(GridInput(path, layer, rule, state), with_kwargs=True))
        handles.append(layer.register_forward_hook(GridOutput(path, group, state)))
    return handles
