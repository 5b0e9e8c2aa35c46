"""The embeddings CP computes per rank (`dtp/runtime/cp/local_embed.py`) against diffusers' own whole outputs.

Each rank's output, concatenated in rank order, must equal diffusers' forward on the whole input bit for bit: the
local forwards repeat diffusers' math on a token range, so any difference is a wrong token range or position. The
gloo parity of the plans that use them (PixArt, Cosmos) is in tests/distributed/test_cp_coverage.py.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.embeddings import PatchEmbed
from diffusers.models.transformers.transformer_cosmos import CosmosLearnablePositionalEmbed, CosmosPatchEmbed
from hypothesis import given, settings
from hypothesis import strategies as st

from dtp.errors import ForwardError
from dtp.plan.cp import SplitRule
from dtp.runtime.cp.local_embed import install_local_embed, local_embed_for
from dtp.runtime.cp.sequence import own_chunk

TOKENS = SplitRule("pos_embed", 0, 1, 3, True)
GRID = SplitRule("patch_embed", 0, 1, 5, True, flatten=True)


def _perturbed(module):
    """Random parameters (diffusers initialises some of these to zeros, which would hide a wrong row)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


def _per_rank(module, rule, x, cp: int, flatten=None):
    """Each rank's output of `module` with its local forward installed, concatenated in rank order."""
    local = local_embed_for(module, [rule])
    assert local is not None
    parts = []
    for rank in range(cp):
        handle = install_local_embed(module, "m", local, rank, cp)
        out = module(x)
        handle.remove()
        parts.append(out if flatten is None else out.flatten(*flatten))
    return torch.cat(parts, dim=1)


@settings(max_examples=12, deadline=None)
@given(cp=st.sampled_from([1, 2, 4]), frames=st.sampled_from([1, 2, 4]), batch=st.integers(1, 2))
def test_cosmos_positional_embedding_per_rank_is_diffusers(cp, frames, batch):
    module = _perturbed(CosmosLearnablePositionalEmbed(hidden_size=8, max_size=(4, 16, 16), patch_size=(1, 2, 2)))
    x = torch.randn(batch, 3, frames, 8, 16)  # 4 x 8 patches per frame
    with torch.no_grad():
        assert torch.equal(_per_rank(module, TOKENS, x, cp), module(x))


@settings(max_examples=12, deadline=None)
@given(cp=st.sampled_from([1, 2, 4]), frames=st.sampled_from([1, 2, 3]), batch=st.integers(1, 2))
def test_cosmos_patch_embedding_per_rank_is_diffusers(cp, frames, batch):
    module = _perturbed(CosmosPatchEmbed(in_channels=3, out_channels=8, patch_size=(1, 2, 2)))
    x = torch.randn(batch, 3, frames, 8, 8)
    with torch.no_grad():
        whole = module(x).flatten(1, 3)  # the caller's flatten
        assert torch.equal(_per_rank(module, GRID, x, cp, flatten=(1, 3)), whole)


@pytest.mark.parametrize(
    "kwargs, size",
    [
        (dict(height=8, width=8), 8),  # the grid of the buffer
        (dict(height=8, width=8), 16),  # another grid: the table is interpolated (PixArt at another size)
        (dict(height=8, width=8, pos_embed_max_size=12), 8),  # SD3's cropped table
        (dict(height=8, width=8, layer_norm=True), 8),
        (dict(height=8, width=8, pos_embed_type=None), 8),
    ],
)
@pytest.mark.parametrize("cp", [2, 4])
def test_patch_embedding_per_rank_is_diffusers(kwargs, size, cp):
    module = _perturbed(PatchEmbed(patch_size=2, in_channels=3, embed_dim=8, **kwargs))
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert torch.equal(_per_rank(module, TOKENS, x, cp), module(x))


def test_removed_forward_is_diffusers_again_and_other_rules_keep_the_generic_hook():
    module = _perturbed(PatchEmbed(height=8, width=8, patch_size=2, in_channels=3, embed_dim=8))
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        whole = module(x)
        handle = install_local_embed(module, "m", local_embed_for(module, [TOKENS]), 1, 2)
        assert module(x).shape[1] == whole.shape[1] // 2
        handle.remove()
        assert torch.equal(module(x), whole)
    assert local_embed_for(module, [SplitRule("pos_embed", 0, 2, 3, True)]) is None  # another dim: generic hook
    assert local_embed_for(torch.nn.Linear(2, 2), [TOKENS]) is None


def test_token_counts_cp_does_not_divide_are_refused():
    module = _perturbed(PatchEmbed(height=6, width=6, patch_size=2, in_channels=3, embed_dim=8))  # 9 tokens
    install_local_embed(module, "pos_embed", local_embed_for(module, [TOKENS]), 0, 2)
    with pytest.raises(ForwardError, match="9 .* not divisible by the cp degree 2"):
        module(torch.randn(1, 3, 6, 6))


def test_output_chunks_are_copies():
    """`own_chunk` (every output cut): the chunk owns its storage, so the hook's caller frees the whole output."""
    x = torch.randn(2, 8, 4)
    chunk = own_chunk(x, 1, 1, 4, "x")
    assert torch.equal(chunk, x[:, 2:4]) and chunk.untyped_storage().nbytes() == chunk.numel() * 4
