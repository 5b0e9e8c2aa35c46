"""Per-rank memory accounting of a (possibly sharded) model."""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor

from .. import quant


def local_tensor_bytes(tensor) -> int:
    """Bytes this rank holds for `tensor`: its local shard for a DTensor; data + scales for a quantized one."""
    if quant.is_quantized(tensor):
        return quant.quantized_bytes(tensor)
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of every parameter as held by this rank."""
    return sum(local_tensor_bytes(p) for p in model.parameters())
