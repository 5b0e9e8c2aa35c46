"""Convolutions split by channels: the Linear styles' math with a channel dim for the feature dim.

A convolution is a Linear over channels at every position (1 x 1) or over channels and a window (k x k): the weight
`[out, in / groups, *kernel]` splits like a Linear's, by output channels (rows, dim 0) or input channels (dim 1).

    conv_colwise          y_r = conv(x, W_r) + b_r                 (W by output channels; y keeps this rank's channels)
    packed_conv_colwise   the same, each block of the output channels split on its own (`blocks:` in the plan)
    conv_depthwise        y_r = conv(x_r, W_r, groups=C / tp) + b_r  (a depthwise conv, groups = channels: each rank
                          filters its own channels; `blocks:` as for the packed colwise conv that feeds it)
    conv_rowwise          y = sum_r conv(x_r, W[:, r]) + b         (W by input channels; one all-reduce, b once after)
    conv_colwise_gathered y = cat_r(conv(x, W_r) + b_r)            (colwise, then all-gathered along the channels)

Sana-Video's Mix-FFN (GLUMBTempConv) in these terms: `conv_inverted` (1 x 1, C -> 2H = [value | gate]) is
packed_conv_colwise [1, 1], `conv_depth` (3 x 3, groups 2H) conv_depthwise [1, 1], so that the local channels are
[value_r | gate_r] and the forward's `chunk(2, dim=1)` pairs them; `conv_point` (1 x 1, H -> C) conv_rowwise; the
temporal `conv_temp` (C -> C, 3 x 1 over frames) conv_colwise_gathered. Worked example, H = 8 at tp = 2: rank 1 holds
conv_inverted's output channels 4..7 and 12..15, conv_depth's same channels with groups 8, conv_point's input columns
4..7. Only zero padding (`padding_mode="zeros"`): the other modes pad by values a rank does not hold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Style, register_style
from .collectives import all_gather_last, all_reduce, local
from .parallel import LinearStyle

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class ConvParallel(LinearStyle):
    """The conv's forward on this rank's weight (and bias) with the module's own stride, padding and dilation."""

    module_type = nn.modules.conv._ConvNd

    def __init__(self, spec, **kwargs):
        super().__init__(spec, **kwargs)
        self.spec = spec

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        for name, value in self.spec.style.local_attributes(module, self.spec, mesh.size()).items():
            setattr(module, name, value)
        return super()._apply(module, mesh)

    def run(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.compute_conv(module, x, local(module.weight), local(module.bias))

    def compute_conv(self, module, x, weight, bias):
        return _conv(module, x, weight, bias)


class ConvRowwise(ConvParallel):
    def compute_conv(self, module, x, weight, bias):
        y = all_reduce(_conv(module, x, weight, None), self.tp.group)
        return y if bias is None else y + bias.view(-1, *[1] * (y.dim() - 2))


class ConvGathered(ConvParallel):
    """With pad=True the gathered channels end in zero padding, dropped here (as `GatheredColwise` does)."""

    def __init__(self, spec, **kwargs):
        assert len(spec.sizes) == 1, "a gathered output is only in full order for a single block"
        super().__init__(spec, **kwargs)
        self.width = spec.sizes[0]

    def compute_conv(self, module, x, weight, bias):
        return self.gather(_conv(module, x, weight, bias))

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        y = gather_channels(y, self.tp.group, self.tp.size)
        return y if y.shape[1] == self.width else y.narrow(1, 0, self.width)


def _conv(module, x, weight, bias):
    conv = _CONV[weight.dim() - 2]
    return conv(x, weight, bias, module.stride, module.padding, module.dilation, module.groups)


def gather_channels(tensor: torch.Tensor, group, size: int) -> torch.Tensor:
    """The rank pieces of `tensor` ([B, c, ...] each) concatenated in rank order along dim 1: [B, size * c, ...]."""
    moved = tensor.movedim(1, -1)
    return all_gather_last(moved, group, size).movedim(-1, 1)


class ConvStyle(Style):
    """Common to the conv styles: the target is a convolution with zero padding (and, but for the depthwise
    style, groups = 1)."""

    parallel_class: type[ConvParallel] = ConvParallel
    depthwise = False

    def accepts(self, module) -> str | None:
        if not isinstance(module, nn.modules.conv._ConvNd) or isinstance(module, nn.modules.conv._ConvTransposeNd):
            return f"not a convolution; '{self.name}' applies to Conv1d / Conv2d / Conv3d layers only"
        if module.padding_mode != "zeros":
            return f"a convolution with padding_mode '{module.padding_mode}'; '{self.name}' needs zero padding"
        depthwise = module.groups == module.in_channels == module.out_channels
        if self.depthwise and not depthwise:
            return f"not a depthwise convolution (groups {module.groups}, channels {module.in_channels})"
        if not self.depthwise and module.groups != 1:
            return f"a grouped convolution (groups {module.groups}); use conv_depthwise for a depthwise one"
        return None

    def local_attributes(self, module, spec, tp: int) -> dict:
        """The module attributes this rank's conv runs with: a depthwise conv's groups are its local channels."""
        if not self.depthwise:
            return {}
        channels = spec.weight_layout.local_shape(module.weight.shape, tp)[0]
        return {"groups": channels, "in_channels": channels, "out_channels": channels}

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        return self.parallel_class(spec, device=device, weights_local=weights_local)


class ConvColwiseStyle(ConvStyle):
    name = "conv_colwise"
    shard_dim = 0
    role = "colwise"


class PackedConvColwiseStyle(ConvColwiseStyle):
    name = "packed_conv_colwise"
    packed = True
    options = frozenset({"blocks"})


class ConvDepthwiseStyle(ConvStyle):
    """Channels in = channels out, each filtered alone: split like the colwise conv that feeds it (role colwise:
    its output stays sharded, a rowwise conv consumes it)."""

    name = "conv_depthwise"
    shard_dim = 0
    role = "colwise"
    packed = True
    options = frozenset({"blocks"})
    depthwise = True


class ConvRowwiseStyle(ConvStyle):
    name = "conv_rowwise"
    shard_dim = 1
    role = "rowwise"
    collective = "all_reduce"
    parallel_class = ConvRowwise


class ConvGatheredStyle(ConvStyle):
    name = "conv_colwise_gathered"
    shard_dim = 0
    role = "whole"
    collective = "all_gather"
    parallel_class = ConvGathered
    gathered_dim = 1


register_style(ConvColwiseStyle, "CONV_COLWISE")
register_style(PackedConvColwiseStyle, "PACKED_CONV_COLWISE")
register_style(ConvDepthwiseStyle, "CONV_DEPTHWISE")
register_style(ConvRowwiseStyle, "CONV_ROWWISE")
register_style(ConvGatheredStyle, "CONV_COLWISE_GATHERED")
