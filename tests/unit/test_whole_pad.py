"""`runtime/cp/whole_pad.py`: a model's own mask over the unpadded whole sequence, padded with it (OmniGen)."""

from __future__ import annotations

import torch

import dtp.runtime.cp.whole_pad as whole_pad
from dtp.runtime.cp.hooks import PadState


def _pads(total: int, local: int) -> PadState:
    pads = PadState()
    slot = pads.slots["last"]
    slot.total, slot.local, slot.padded = total, local, True
    return pads


def test_additive_and_bool_masks_padded(monkeypatch):
    """S = 5 at cp = 2 (3 a rank): 6 x 6, the pad key masked for every query, the real part unchanged, the pad row
    seeing every real key; a mask of another shape, or no padding, passes unchanged."""
    monkeypatch.setattr(whole_pad.dist, "get_world_size", lambda group: 2)
    query = torch.zeros(2, 3, 4, 8)
    additive = torch.randn(2, 1, 5, 5)
    out = whole_pad.pad_whole_mask(additive, query, None, _pads(5, 3))
    assert out.shape == (2, 1, 6, 6) and torch.equal(out[..., :5, :5], additive)
    assert (out[..., 5] == torch.finfo(torch.float32).min).all() and (out[..., 5, :5] == 0).all()
    allowed = torch.rand(1, 1, 5, 5) > 0.5
    out = whole_pad.pad_whole_mask(allowed, query, None, _pads(5, 3))
    assert out.shape == (1, 1, 6, 6) and not out[..., 5].any() and out[..., 5, :5].all()
    assert whole_pad.pad_whole_mask(additive, query, None, PadState()) is additive
    local = torch.randn(2, 1, 3, 3)
    assert whole_pad.pad_whole_mask(local, query, None, _pads(5, 3)) is local
