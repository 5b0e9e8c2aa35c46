"""Forward hooks that cut a `shard_output` module's output tensors to this rank's piece (resolve/outputs.py)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ForwardError
from ..resolve.layout import Layout


def install_output_cuts(model: nn.Module, specs, mesh) -> None:
    """Register, on every spec'd module, a hook that returns its outputs cut along the spec's dim."""
    tp, rank = mesh.size(), mesh.get_local_rank()
    for spec in specs:
        model.get_submodule(spec.path).register_forward_hook(_cutter(spec, tp, rank))


def _cutter(spec, tp: int, rank: int):
    def hook(module, args, output):
        return _cut(output, spec, tp, rank)

    return hook


def _cut(output, spec, tp: int, rank: int):
    """Each tensor in `output` (a tensor, or a tuple/list of them) cut to rank `rank`'s contiguous piece."""
    if isinstance(output, (tuple, list)):
        return type(output)(_cut(o, spec, tp, rank) for o in output)
    if not isinstance(output, torch.Tensor):
        return output
    size = output.shape[spec.dim]
    if size % tp:
        raise ForwardError(
            f"'{spec.path}' (plan key '{spec.rule.key}', shard_output dim {spec.dim}): size {size} is not divisible "
            f"by tp={tp}; its output cannot follow the sharded heads."
        )
    return Layout(spec.dim % output.dim(), (size,)).local_slice(output, tp, rank)
