"""Quantized weights under tensor parallelism (torchao Int8Tensor / Float8Tensor; diffusers' layerwise casting).

`kinds` recognizes a quantized weight and says whether dtp can shard it exactly; `shard` slices its
data and scales with the same `Layout` math as every other parameter; `check` refuses the rest in
`prepare`, before anything is mutated.
"""

from .after import FSDP_CANNOT, keep_layout, quantize, quantize_linear, repair_padded_rows
from .check import check_not_quantized, check_quantized
from .kinds import LAYOUT_ATTR, QuantKind, describe, is_quantized
from .load import LoadQuantizer
from .schemes import SCHEMES, config_for, quantized_bytes
from .shard import distribute_quantized, full_weight, rebuild, shard_pieces, shard_weight, sharded_parameter

__all__ = [
    "FSDP_CANNOT",
    "LAYOUT_ATTR",
    "LoadQuantizer",
    "SCHEMES",
    "QuantKind",
    "check_not_quantized",
    "check_quantized",
    "config_for",
    "describe",
    "distribute_quantized",
    "full_weight",
    "is_quantized",
    "keep_layout",
    "quantize",
    "quantize_linear",
    "quantized_bytes",
    "rebuild",
    "repair_padded_rows",
    "shard_pieces",
    "shard_weight",
    "sharded_parameter",
]
