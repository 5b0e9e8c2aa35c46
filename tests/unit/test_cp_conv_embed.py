"""`SplitRule.embed` with a Conv3d and `added` (`runtime/cp/conv_embed.py`, `grid_embed.py`): Wan 2.2 Animate's patch
embedding and its pose embedding added into the grid's frames 1.. (`hidden_states[:, :, 1:] = ... + pose`), both
computed on a rank's tokens only. One process: each "rank" is a chunk of the forward's own add and flatten run on the
index codes, embedded by `EmbedRows` and compared with diffusers' math on the whole grid (conv, add, flatten, chunk).
Negative control: the codes read as plain token indices (the pose rows never added)."""

from __future__ import annotations

import types as types_module

import pytest
import torch
from torch import nn

import dtp.runtime.cp.grid_embed as grid_embed
from dtp import PlanError
from dtp.plan.cp import SplitRule, cp_plan_from_mapping
from dtp.resolve.binding.cp import _embeds
from dtp.runtime.cp.conv_embed import conv_rows
from dtp.runtime.cp.grid_embed import EmbedRows, EmbedState, added_grid, index_grid

C, P, D = 6, 4, 8  # latent / pose channels, width


class _Animate(nn.Module):
    """The two embeddings of Wan 2.2 Animate and its forward's add and flatten (diffusers, step 2)."""

    def __init__(self):
        super().__init__()
        self.patch_embedding = nn.Conv3d(C, D, kernel_size=(1, 2, 2), stride=(1, 2, 2))
        self.pose_patch_embedding = nn.Conv3d(P, D, kernel_size=(1, 2, 2), stride=(1, 2, 2))

    def forward(self, x, pose):
        hidden_states = self.patch_embedding(x)
        pose = self.pose_patch_embedding(pose)
        hidden_states[:, :, 1:] = hidden_states[:, :, 1:] + pose
        return hidden_states.flatten(2).transpose(1, 2).contiguous()


class _Block(nn.Module):
    def forward(self, hidden_states):
        return hidden_states


def test_conv_rows_are_the_conv_of_each_patch():
    """Tokens [3, 0, 11, 5] of a [2, C, 3, 4, 4] latent grid: the whole conv's flattened rows at those positions."""
    torch.manual_seed(0)
    conv, x = nn.Conv3d(C, D, kernel_size=(1, 2, 2), stride=(1, 2, 2)), torch.randn(2, C, 3, 4, 4)
    index = torch.tensor([3, 0, 11, 5])
    with torch.no_grad():
        ref = conv(x).flatten(2).transpose(1, 2)[:, index]
        assert (conv_rows(conv, x, index) - ref).abs().max() <= 1e-6


def _ranks(cp: int, broken: bool = False) -> list[float]:
    """Each rank's error against its chunk of diffusers' tokens, relative to the largest token (3 frames of 2 x 2
    tokens: at cp = 4 rank 1 holds the end of frame 0, which has no pose, and the start of frame 1)."""
    torch.manual_seed(1)
    model, x, pose = _Animate(), torch.randn(2, C, 3, 4, 4), torch.randn(2, P, 2, 4, 4)
    with torch.no_grad():
        ref = model(x, pose)
        state = EmbedState()
        model.patch_embedding.forward = types_module.MethodType(index_grid(state), model.patch_embedding)
        model.pose_patch_embedding.forward = types_module.MethodType(added_grid(state), model.pose_patch_embedding)
        rule = SplitRule("blocks.0", "hidden_states", 1, embed="patch_embedding", added="pose_patch_embedding")
        hook = EmbedRows("blocks.0", _Block(), rule, model.patch_embedding, state, model.pose_patch_embedding)
        errors = []
        for rank in range(cp):
            codes = model(x, pose)
            assert codes.dtype == torch.int64 and codes.shape == (2, 12, 1)
            (rows,), _ = hook(None, (codes.chunk(cp, dim=1)[rank],), {})
            errors.append(float((rows - ref.chunk(cp, dim=1)[rank]).abs().max() / ref.abs().max()))
    return errors


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_embeds_its_tokens_with_their_pose_rows(cp):
    """Every rank's tokens within 1e-6 of its chunk of the whole embedded, pose-added, flattened video."""
    assert max(_ranks(cp)) <= 1e-6, _ranks(cp)


def test_pose_rows_not_added_fail(monkeypatch):
    """Negative control: every code read as a token without a pose row (row -1)."""
    monkeypatch.setattr(grid_embed, "decode", lambda codes, count: (codes % count, torch.full_like(codes, -1)))
    assert max(_ranks(4)) > 1e-2, _ranks(4)


def test_a_padded_or_overlapping_conv_is_refused():
    """The conv must patchify (kernel = stride, no padding): a PlanError naming it, before anything is hooked."""
    model = _Animate()
    model.pose_patch_embedding = nn.Conv3d(P, D, kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
    rule = SplitRule("blocks.0", "hidden_states", 1, embed="patch_embedding", added="pose_patch_embedding")
    with pytest.raises(PlanError, match="pose_patch_embedding.*kernel"):
        _embeds("wan_animate", model, [("blocks.0", rule)])
    assert _embeds("wan_animate", _Animate(), [("blocks.0", rule)])[0][1] == "patch_embedding"


@pytest.mark.parametrize(
    "spec,match",
    [
        ({"dim": 1, "added": "pose_patch_embedding"}, "goes with a plain input split"),
        ({"dim": 1, "embed": "e", "per_frame": "t", "added": "p"}, "one of them only"),
        ({"dim": 1, "embed": "e", "added": "blocks.*"}, "module paths"),
    ],
)
def test_added_plan_errors(spec, match):
    with pytest.raises(PlanError, match=match):
        cp_plan_from_mapping({"split": {"blocks.0": {"hidden_states": spec}}, "gather": {"proj_out": {"dim": 1}}}, "x")
