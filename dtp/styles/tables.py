"""Styles that split no Linear: a norm across heads and output tables cut to this rank's features.

rmsnorm_across_heads: an RMSNorm over the whole q or k width (all heads), applied right after a colwise q/k
projection (Wan, SkyReels-V2, LTX, HiDream QK-norm). Its weight is split like the heads (dim 0, contiguous
per rank) and the sum of squares is all-reduced over `tp`, then divided by the TRUE (global) width, so
`y = x / sqrt(sum_r |x_r|^2 / D + eps) * w_r` is exact per rank (`resolve/norms.py`, `runtime/norms.py`).

shard_output (with `dim`): any parameter-free module whose output tensors are per-feature tables that a
sharded consumer reads, e.g. RoPE tables over the full inner dim (LTX: cos/sin [B, S, heads * head_dim]) or
per head (Mochi: [S, heads, head_dim / 2]). Each output tensor is cut along `dim` to this rank's contiguous
piece, the same piece its q/k heads are (`resolve/outputs.py`, `runtime/outputs.py`).
"""

from __future__ import annotations

from .base import Style, register_style


class RMSNormAcrossHeadsStyle(Style):
    name = "rmsnorm_across_heads"
    kind = "norm"
    shard_dim = 0
    role = "table"
    collective = "all_reduce"

    def accepts(self, module) -> str | None:
        return None  # resolve/norms.py checks the norm class and its width


class ShardOutputStyle(Style):
    name = "shard_output"
    kind = "output"
    shard_dim = 0
    role = "table"
    options = frozenset({"dim"})

    def accepts(self, module) -> str | None:
        return None  # resolve/outputs.py checks that the module has no parameters


register_style(RMSNormAcrossHeadsStyle, "RMSNORM_ACROSS_HEADS")
register_style(ShardOutputStyle, "SHARD_OUTPUT")
