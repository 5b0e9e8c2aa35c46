"""`dtp check` cuts a stack of alike blocks to its first block before tracing; a plan that gathers at the stack's
last block (`visual_transformer_blocks.-1`: Kandinsky 5 / 6) would lose that hook, and the forward's reshape of the
still-split tokens back to the grid failed ("shape '[-1, 2, 2, 11904, 4096]' is invalid"). `forward.hooks_alike`
tells such a model apart, and check traces it whole."""

from __future__ import annotations

import dtp
from dtp.analysis.forward import hooks_alike
from dtp.testing.tiny import PLAN_CLASSES, tiny_model


def test_a_gather_at_the_last_block_is_uneven(fake_world):
    """Kandinsky 6 at (cp, tp) = (2, 2): its last fused block carries a hook its first lacks (`cp.grid`'s
    `HoldTokens`, a gather before); Wan's blocks all
    carry the same RoPE split hooks (and its gather is outside the stack): alike, cut as before."""
    mesh = dtp.make_mesh(tp=2, cp=2, device_type="cpu")
    kandinsky6 = dtp.parallelize(tiny_model(PLAN_CLASSES["kandinsky6"]), mesh)
    wan = dtp.parallelize(tiny_model(PLAN_CLASSES["wan"]), mesh)
    assert not hooks_alike(kandinsky6) and hooks_alike(wan)
    assert hooks_alike(tiny_model(PLAN_CLASSES["kandinsky6"]))  # no cp hooks at all
