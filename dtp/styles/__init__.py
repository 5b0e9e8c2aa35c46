"""Plan styles as classes (`base.Style`), one file per kind of split, each registered by name.

    colwise.py    colwise, packed_colwise          gathered.py   colwise_gathered
    rowwise.py    rowwise, packed_rowwise          embedding.py  vocab_parallel, embedding_colwise
    tables.py     rmsnorm_across_heads, shard_output
    experts.py    experts (a mixture of SwiGLU experts in two 3-D parameters: each rank a slice of every expert)
    conv.py       conv_colwise, packed_conv_colwise, conv_depthwise, conv_rowwise, conv_colwise_gathered
    parallel.py   the torch ParallelStyles they build (sharded parameters from `Layout.local_slice`; the forward
                  on their local tensors)
    collectives.py  a parameter's local tensor, the in-place all-reduce and all-gather of the sharded forward

A new style is a new file with a `Style` subclass and its `register_style` call, imported here (or by the
user's code before the plan is parsed: `tests/unit/test_toy_style.py` registers one from outside).
"""

from . import colwise, conv, embedding, experts, gathered, rowwise, tables  # noqa: F401  (each registers its styles)
from .base import Style, register_style, unregister_style
from .parallel import LAYOUT_ATTR, LinearStyle, full_tensor, local_parameter, shard_parameter

__all__ = [
    "LAYOUT_ATTR",
    "LinearStyle",
    "Style",
    "full_tensor",
    "local_parameter",
    "register_style",
    "shard_parameter",
    "unregister_style",
]
