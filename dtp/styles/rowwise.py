"""rowwise and packed_rowwise: W columns (input features) split; one all-reduce; the bias added once (rank 0's matmul).

    y = sum_r x_r W_r^T + b

packed_rowwise: a Linear fed by a concatenation (single-stream `proj_out` of cat([attn, mlp])): each input
block is split on its own, matching the colwise blocks that produced it.
"""

from __future__ import annotations

from .base import Style, register_style
from .parallel import Rowwise


class RowwiseStyle(Style):
    name = "rowwise"
    shard_dim = 1
    role = "rowwise"
    collective = "all_reduce"

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        return Rowwise(spec, device=device, weights_local=weights_local)


class PackedRowwiseStyle(RowwiseStyle):
    name = "packed_rowwise"
    packed = True
    options = frozenset({"blocks"})
    blocks_attr = "_tp_packed_row_blocks"


register_style(RowwiseStyle, "ROWWISE")
register_style(PackedRowwiseStyle, "PACKED_ROWWISE")
