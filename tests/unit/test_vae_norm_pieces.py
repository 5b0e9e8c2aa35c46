"""The parallel VAE's GroupNorm on a bf16 strip, normalized in fp32 pieces (dtp/vae/norm.py): the same values as in
one fp32 piece, and within bf16 rounding of torch's GroupNorm of the fp32 strip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dtp.vae.norm as vae_norm


def _one_rank(stats, split):
    """`combine` on one rank: Chan's combination of a single part is that part's (mean, variance)."""
    return stats[1], stats[2]


@pytest.mark.parametrize("batch,channels,groups", [(1, 64, 32), (2, 36, 6)])  # 6 groups: uneven pieces of 8
def test_pieces_change_nothing(monkeypatch, batch, channels, groups):
    monkeypatch.setattr(vae_norm, "combine", _one_rank)
    torch.manual_seed(0)
    norm = nn.GroupNorm(groups, channels, eps=1e-6)
    nn.init.normal_(norm.weight), nn.init.normal_(norm.bias)
    x = (torch.randn(batch, channels, 6, 10) * 3 + 1).to(torch.bfloat16)
    pieces = vae_norm.group_norm_rows(x, norm, split=None)
    monkeypatch.setattr(vae_norm, "UPCAST_CHUNKS", 1)
    whole = vae_norm.group_norm_rows(x, norm, split=None)
    assert pieces.dtype == torch.bfloat16 and torch.equal(pieces, whole)
    reference = nn.functional.group_norm(x.float(), groups, norm.weight, norm.bias, norm.eps)
    assert (pieces.float() - reference).abs().max() <= 2**-7 * reference.abs().max()  # one bf16 rounding
