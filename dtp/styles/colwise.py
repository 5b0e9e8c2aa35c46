"""colwise and packed_colwise: W rows (output features) split, bias with them; the output stays sharded.

    y_r = x W_r^T + b_r        (a rowwise layer downstream all-reduces the pair's partial sums)

packed_colwise: a fused Linear whose output holds several logical blocks (q, k, v; GEGLU's two halves):
each block is split across ranks on its own, so rank r holds row block r of every block.
"""

from __future__ import annotations

from .base import Style, register_style
from .parallel import Colwise


class ColwiseStyle(Style):
    name = "colwise"
    shard_dim = 0
    role = "colwise"

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        return Colwise(spec, device=device, weights_local=weights_local)


class PackedColwiseStyle(ColwiseStyle):
    name = "packed_colwise"
    packed = True
    options = frozenset({"blocks"})
    blocks_attr = "_tp_packed_col_blocks"


register_style(ColwiseStyle, "COLWISE")
register_style(PackedColwiseStyle, "PACKED_COLWISE")
