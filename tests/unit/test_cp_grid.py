"""`cp.grid` (`runtime/cp/grid.py`): the output layer of Kandinsky 5 / 6 / 6 SR runs on each rank's rows and its patch
grid is put back in grid order. One process: each "rank" is a slice of the token order, its output assembled with
the product's `token_patches` / `patch_grid` (the all-gather is a `cat` in rank order), compared with diffusers' own
output layer on the whole grid. The token order is read off the forward's own reshape of the index stand-in
(Kandinsky 5's `fractal_unflatten`: raster; 6 SR's `_local_merge`: NABLA's 64-token blocks). Negative controls: the
grid order ignored (SR) and the patches taken in the layer's column order (the token-major permute dropped)."""

from __future__ import annotations

import types as types_module

import pytest
import torch
from diffusers.models.transformers.transformer_kandinsky import Kandinsky5OutLayer, fractal_unflatten
from diffusers.models.transformers.transformer_kandinsky6_sr import (
    Kandinsky6SROutLayer,
    Kandinsky6SRVisualEmbeddings,
    _local_merge,
    _local_patch,
)
from torch import nn

from dtp import ForwardError
from dtp.plan.cp import GridRule, SplitRule
from dtp.runtime.cp.grid import GridInput, GridState, patch_grid, token_patches
from dtp.runtime.cp.grid_embed import EmbedRows, EmbedState, index_grid, zero_table

D, T_DIM, C = 16, 8, 4


def _grid_of(tokens: torch.Tensor, layout: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """The forward's own reshape of its [B, S, X] tokens to the [B, F, H, W, X] grid."""
    if layout == "raster":  # Kandinsky 5 (sparse_params None)
        return fractal_unflatten(tokens, (tokens.shape[0], *shape))
    # Kandinsky 6 SR: 64-token blocks of 8 x 8 tokens (its forward, step 4)
    blocks = tokens.reshape(tokens.shape[0], -1, 64, tokens.shape[-1])
    return _local_merge(blocks, shape, (1, 8, 8), dim=1)


def _call(layer, grid: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    """Kandinsky 5's layer also takes the text embedding (unused); 6 SR's does not."""
    return layer(grid, None, temb) if isinstance(layer, Kandinsky5OutLayer) else layer(grid, temb)


def _ranks(layer, tokens, temb, layout, shape, cp, broken=None) -> torch.Tensor:
    """Each rank's rows through `layer` as a grid of one row, assembled as `GridOutput` does."""
    batch, total, _ = tokens.shape
    stand_in = torch.arange(total).view(1, total, 1).expand(batch, total, 1)  # `HoldTokens`' stand-in
    order = _grid_of(stand_in, layout, shape)[0, ..., 0].reshape(-1)
    if broken == "order":
        order = torch.arange(total)
    patches = []
    for rows in tokens.chunk(cp, dim=1):
        out = _call(layer, rows[:, None, None], temb)
        n = rows.shape[1]
        if broken == "permute":  # the layer's columns read as if token-major
            patches.append(out.reshape(batch, n, *out.shape[1:3], -1, out.shape[-1]))
        else:
            patches.append(token_patches(out, n, "test"))
    return patch_grid(torch.cat(patches, dim=1), order, shape)


CASES = {  # layout -> (output layer, patch size, token grid (F, H, W), cp)
    "raster": (Kandinsky5OutLayer, (1, 2, 2), (3, 4, 6), 4),  # 72 tokens, 18 a rank: rows cut mid-row
    "blocks": (Kandinsky6SROutLayer, (1, 2, 2), (2, 8, 16), 2),  # 4 blocks of 64, two a rank
}


def _case(layout: str):
    cls, patch, shape, cp = CASES[layout]
    torch.manual_seed(0)
    layer = cls(D, T_DIM, C, patch)
    for p in layer.parameters():  # every weight matters (no zero-init)
        torch.nn.init.normal_(p, std=0.3)
    tokens, temb = torch.randn(2, shape[0] * shape[1] * shape[2], D), torch.randn(2, T_DIM)
    ref = _call(layer, _grid_of(tokens, layout, shape), temb)
    return layer, tokens, temb, shape, cp, ref


@pytest.mark.parametrize("layout", CASES)
def test_rows_through_the_output_layer_equal_the_whole_grid(layout):
    """Kandinsky 5 (raster, a rank's rows ending mid-row) and 6 SR (block-major): exact (<= 1e-6 of max |ref|)."""
    layer, tokens, temb, shape, cp, ref = _case(layout)
    with torch.no_grad():
        out = _ranks(layer, tokens, temb, layout, shape, cp)
    assert out.shape == ref.shape
    assert (out - ref).abs().max() <= 1e-6 * ref.abs().max()


@pytest.mark.parametrize("layout,broken", [("blocks", "order"), ("raster", "permute")])
def test_a_wrong_grid_order_or_patch_layout_fails(layout, broken):
    """Negative controls: 6 SR's tokens laid out in token order (the forward's block order ignored); Kandinsky 5's
    columns [t p2 + i] read as token-major: both far off."""
    layer, tokens, temb, shape, cp, ref = _case(layout)
    with torch.no_grad():
        out = _ranks(layer, tokens, temb, layout, shape, cp, broken=broken)
    assert (out - ref).abs().max() > 1e-2 * ref.abs().max()


def test_the_layer_refuses_anything_but_theindex_grid():
    """A forward that computed on the stand-in (a float grid, not the int64 indices) is a ForwardError."""
    layer = Kandinsky5OutLayer(D, T_DIM, C, (1, 2, 2))
    rule = GridRule("out_layer", "visual_embed", "visual_transformer_blocks.-1")
    state = GridState()
    state.rows, state.total = torch.randn(1, 6, D), 12
    hook = GridInput("out_layer", layer, rule, state)
    with pytest.raises(ForwardError, match="grid of the token indices"):
        hook(layer, (torch.zeros(1, 1, 3, 4, 1), torch.randn(1, T_DIM)), {})
    grid = torch.arange(12).view(1, 1, 3, 4, 1)
    args, _ = hook(layer, (grid, torch.randn(1, T_DIM)), {})
    assert args[0].shape == (1, 1, 1, 6, D) and state.order.tolist() == list(range(12))


class _Block(nn.Module):
    """The first block's signature, for `EmbedRows`' binder."""

    def forward(self, hidden_states):
        return hidden_states


def _flatten(grid: torch.Tensor, layout: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """The forward's own flatten of its [B, F, H, W, X] grid to tokens (Kandinsky 5 / 6: raster; 6 SR: 64-blocks)."""
    if layout == "raster":
        return grid.flatten(1, 3)
    return _local_patch(grid, shape, (1, 8, 8), dim=1).flatten(1, 2)


@pytest.mark.parametrize("layout,frames", [("raster", True), ("blocks", False), ("raster", "broken")])
def test_each_rank_embeds_its_own_tokens(layout, frames):
    """`SplitRule.embed`: the embedding hands the forward the index grid, the forward flattens it, the split cuts it,
    and `EmbedRows` embeds the rank's indices: equal to the rank's cut of the whole embedded tokens (Kandinsky 6's
    patch embedding, raster with its per-frame token types; 6 SR's, block-major). Negative control: the per-frame
    table's rows not added (`broken`): far off."""
    shape, cp = ((3, 4, 6), 4) if layout == "raster" else ((2, 8, 16), 2)
    torch.manual_seed(1)
    embed, types = Kandinsky6SRVisualEmbeddings(C, D, (1, 2, 2)), nn.Embedding(2, D)
    x, ids = torch.randn(2, shape[0], shape[1] * 2, shape[2] * 2, C), torch.tensor([[0, 1, 0], [1, 1, 0]])
    with torch.no_grad():
        whole = embed(x) + (types(ids)[:, :, None, None, :] if frames else 0)
        ref = _flatten(whole, layout, shape)
        state = EmbedState()
        embed.forward = types_module.MethodType(index_grid(state), embed)
        if frames:
            types.forward = types_module.MethodType(zero_table(state, nn.Embedding.forward), types)
        rule = SplitRule("blocks.0", "hidden_states", 1, embed="embed")
        hook = EmbedRows("blocks.0", _Block(), rule, embed, state)
        for rank in range(cp):
            grid = embed(x) + (types(ids)[:, :, None, None, :] if frames else 0)
            if frames == "broken":
                state.table = None
            index = _flatten(grid, layout, shape).chunk(cp, dim=1)[rank]
            (rows,), _ = hook(None, (index,), {})
            error = (rows - ref.chunk(cp, dim=1)[rank]).abs().max() / ref.abs().max()
            assert error > 1e-2 if frames == "broken" else error <= 1e-6, (rank, float(error))
