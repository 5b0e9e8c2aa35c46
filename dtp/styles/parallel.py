"""The torch ParallelStyles behind the linear plan styles, written on torch's public contracts only.

Each style implements `ParallelStyle._apply(module, mesh)` with the public `distribute_module`,
`DTensor.from_local`, `redistribute` and `to_local`, so nothing here depends on the private hooks
of torch's Colwise/RowwiseParallel. The math is theirs:

    colwise  y_r = x W_r^T + b_r             (W split by output rows, bias with them; y stays sharded)
    rowwise  y   = sum_r x_r W_r^T + b       (W split by input columns; one all-reduce; b added once)
    gathered y   = all_gather_r(x W_r^T + b_r)   (colwise, then the full feature order on every rank)

With pad=True a layout's padded rows/columns are zeros made on this rank (`Layout.padded_sizes`):
a padded colwise output unit is 0 and meets a zero rowwise column, so the sums are unchanged; a
gathered output drops its trailing padded features after the all-gather.

Parameters are built from this rank's slice only (`Layout.local_slice`): no weight collective is
issued and no full copy is made, so every rank must start with identical weights (loaded from one
checkpoint, or created under the same seed). With `weights_local=True` the parameters were already
placed by the loader as DTensors and only the forward hooks are installed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle

from .. import quant

LAYOUT_ATTR = quant.LAYOUT_ATTR  # a sharded parameter's Layout, for `full_tensor`


def local_parameter(local: torch.Tensor, layout, mesh, requires_grad: bool = True) -> nn.Parameter:
    """Wrap this rank's tensor as a DTensor parameter: `Shard(layout.dim)` of a block-wise slice (its
    layout recorded for `full_tensor`), or `Replicate()` when `layout` is None. No communication."""
    placement = Replicate() if layout is None else Shard(layout.dim)
    param = nn.Parameter(DTensor.from_local(local, mesh, [placement], run_check=False), requires_grad=requires_grad)
    if layout is not None:
        setattr(param, LAYOUT_ATTR, layout)
    return param


def shard_parameter(param: nn.Parameter, layout, mesh, device=None) -> nn.Parameter:
    """This rank's DTensor parameter cut from the full `param`; only the slice moves to `device`."""
    if layout is not None and quant.is_quantized(param.data):  # torchao subclass: DTensors inside (dtp/quant)
        return quant.sharded_parameter(quant.shard_weight(param.data, layout, mesh, device), layout)
    tensor = param.data
    local = tensor if layout is None else layout.local_slice(tensor, mesh.size(), mesh.get_local_rank())
    if device is not None:
        local = local.to(device)
    return local_parameter(local, layout, mesh, param.requires_grad)


class LinearStyle(ParallelStyle):
    """One planned Linear: partition its parameters by their layouts, then hook its input and output.

    `spec` is the resolved module (`resolve.linears.LinearSpec`): its `param_layouts()` say how each
    parameter is cut (`resolve.layout.Layout`, the one home of the slicing math).
    """

    module_type = nn.Linear  # what `_apply` distributes (resolve refuses anything else)

    def __init__(self, spec, *, device=None, weights_local: bool = False):
        super().__init__()
        self.layouts = spec.param_layouts()
        self.device = device
        self.weights_local = weights_local

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        assert isinstance(module, self.module_type), type(module)  # resolve refuses anything else
        if quant.is_quantized(module.weight):  # distribute_module would try to broadcast the torchao subclass
            return quant.distribute_quantized(module, mesh, self._partition, self._input, self._output)
        return distribute_module(module, mesh, self._partition, self._input, self._output)

    def _partition(self, name, module: nn.Module, mesh) -> None:
        for param_name, param in list(module.named_parameters(recurse=False)):
            if self.weights_local:
                placed = isinstance(param.data, DTensor) or quant.is_quantized(param)  # quantized: DTensors inside
                assert placed, f"{name}.{param_name} was not placed by the loader"
                continue
            module.register_parameter(param_name, shard_parameter(param, self.layouts[param_name], mesh, self.device))

    input_placement = Replicate()

    def _input(self, module, inputs, mesh):
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [self.input_placement], run_check=False)
        return (x, *inputs[1:])

    output_placement = Shard(-1)

    def _output(self, module, output, mesh):
        if output.placements != (self.output_placement,):
            output = output.redistribute(placements=[self.output_placement], async_op=_overlap(mesh))
        return output.to_local()


def _overlap(mesh) -> bool:
    """Asynchronous output collectives on accelerators only.

    Under gloo, torch's asynchronous redistribute was seen to corrupt the heap now and then
    ("malloc(): unaligned tcache chunk detected", then "Connection reset by peer" on the other
    ranks, unwaited collectives at exit); on CPU there is no compute to overlap anyway.
    """
    return mesh.device_type != "cpu"


class Colwise(LinearStyle):
    """colwise / packed_colwise: the output stays sharded by blocks (this rank's piece of each)."""


class Rowwise(LinearStyle):
    """rowwise / packed_rowwise: input sharded on its last dim; the partial sums are all-reduced."""

    input_placement = Shard(-1)
    output_placement = Replicate()


class GatheredColwise(LinearStyle):
    """colwise_gathered: colwise, then the output is all-gathered to the full feature order.

    `W = [W_1; ...; W_tp]` (one block, contiguous rows per rank): the all-gather along the last
    dim concatenates the `y_r` in rank order, which is exactly `y`. Used for Linears applied to few
    rows whose output every rank needs whole, e.g. AdaLN modulation (`[batch, 6 * dim]`, chunked
    into shift/scale/gate later): the weight costs 1/tp per rank, the all-gather `batch * 6 * dim`.
    """

    output_placement = Replicate()

    def __init__(self, spec, **kwargs):
        assert len(spec.sizes) == 1, "a gathered output is only in full order for a single block"
        super().__init__(spec, **kwargs)
        self.width = spec.sizes[0]  # with pad=True the gathered rows end in zero padding, dropped here

    def _output(self, module, output, mesh):
        return super()._output(module, output, mesh)[..., : self.width]


def full_tensor(param) -> torch.Tensor:
    """The original (unsharded) tensor of a parameter sharded by these styles; gathers over the mesh."""
    layout = getattr(param, LAYOUT_ATTR, None)
    if quant.is_quantized(param) and layout is not None:
        return quant.full_weight(param, layout)  # the unsharded quantized weight (dtp/quant/shard.py)
    if not isinstance(param, DTensor):
        return param.detach()
    if layout is None:
        return param.full_tensor()
    gathered = param.redistribute(placements=[Replicate()]).to_local()
    # redistribute() concatenates the rank pieces in rank order, which `assemble` reorders by block.
    return layout.assemble(list(torch.chunk(gathered, param.device_mesh.size(), dim=layout.dim)))
