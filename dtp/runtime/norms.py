"""The distributed RMSNorm that replaces an `rmsnorm_across_heads` module (see resolve/norms.py).

Each rank holds `x_r`, its `D / tp` features of the q (or k) projection, and `w_r`, the matching
slice of the weight. The norm over all `D` features is

    y_r = x_r / sqrt((sum_r' sum x_r'^2) / D + eps) * w_r (+ b_r)

so one all-reduce of a `[..., 1]` tensor of per-row sums of squares per call restores it exactly.
The mean divides by the TRUE width `D`, not the local `D / tp` (that would be a per-rank norm,
silently wrong). The arithmetic follows diffusers' RMSNorm: squares in fp32, the result cast to a
half-precision weight's dtype before the multiply, or back to the input dtype without a weight.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..resolve.binding.norms import NormSpec
from ..styles import shard_parameter
from ..styles.collectives import TpGroup, all_reduce, local


class ShardedRMSNorm(nn.Module):
    """RMSNorm over features split across the `tp` ranks (weight and bias are `Shard(0)` DTensors)."""

    def __init__(self, width: int, eps: float | None, mesh, weight=None, bias=None):
        super().__init__()
        self.width = width  # global D, the divisor of the mean
        self.eps = eps
        self.tp = TpGroup(mesh)
        self.weight = weight
        self.bias = bias

    @property
    def mesh(self):
        return self.tp.mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # On plain tensors: the per-row sums of squares are a fresh [..., 1] tensor, summed over tp in place, then
        # turned into 1 / rms in place (no fresh tensor per op; no `float()` call on fp32: host time is what a small
        # norm costs).
        xf = x if x.dtype == torch.float32 else x.float()
        squares = all_reduce(xf.pow(2).sum(-1, keepdim=True), self.tp.group)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        y = x * squares.div_(self.width).add_(eps).rsqrt_()
        if self.weight is None:
            return y.to(x.dtype)
        weight = local(self.weight)
        if weight.dtype in (torch.float16, torch.bfloat16):
            y = y.to(weight.dtype)
        y = y * weight
        return y + local(self.bias) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"width={self.width}, eps={self.eps}, tp={self.tp.size}"


def install_sharded_norms(model: nn.Module, specs, mesh, *, device=None, weights_local: bool = False) -> None:
    """Swap every spec'd norm for a `ShardedRMSNorm` holding this rank's parameter slices."""
    for spec in specs:
        parent_path, _, name = spec.path.rpartition(".")
        parent = model.get_submodule(parent_path)
        setattr(parent, name, sharded_norm(getattr(parent, name), spec, mesh, device, weights_local))


def sharded_norm(norm: nn.Module, spec: NormSpec, mesh, device=None, weights_local: bool = False) -> ShardedRMSNorm:
    """The replacement for `norm`: parameters cut by `spec.param_layouts()` (or already placed by the loader)."""
    params = {}
    for name, layout in spec.param_layouts().items():
        param = getattr(norm, name)
        if weights_local:
            assert isinstance(param.data, DTensor), f"{spec.path}.{name} was not placed by the loader"
            params[name] = param
        else:
            params[name] = shard_parameter(param, layout, mesh, device)
    return ShardedRMSNorm(spec.width, spec.eps, mesh, **params)
