"""The torch ParallelStyles behind the linear plan styles: parameters as DTensors at rest, a forward on plain tensors.

Each style implements `ParallelStyle._apply(module, mesh)`: it cuts the parameters to this rank's slices
(`Layout.local_slice`) as DTensors, and replaces the Linear's `forward` by `LinearStyle.run` on their local tensors,
issuing its collective itself (`collectives.py`). The math is torch's Colwise/RowwiseParallel's:

    colwise  y_r = x W_r^T + b_r             (W split by output rows, bias with them; y stays sharded)
    rowwise  y   = sum_r x_r W_r^T + b       (W split by input columns; one all-reduce; b added once, by rank 0)
    gathered y   = all_gather_r(x W_r^T + b_r)   (colwise, then the full feature order on every rank)

Why a forward replacement and not hooks around DTensor math: each Linear call then costs one Python call more than
diffusers' (the replacement), where DTensor dispatch cost 3-14x the plain `F.linear` in host time and the hooks a
`from_local` and a `redistribute` each; and a replaced `forward` is what dynamo traces best (no module state changed
inside the call, unlike local views put in `__dict__` by a pre-hook as `experts.py` does for a forward it cannot
replace). The parameters stay DTensors in `_parameters`, so state dicts, LoRA (peft wraps the Linear and calls it),
`full_tensor`, checkpoints and FSDP2 (its unshard registers tp DTensors again before each unit runs) see what they
always saw. Two paths stay on DTensor math: a torchao-quantized weight (its subclass holds DTensors; torchao's own
DTensor reductions make a dynamic activation's scale the whole token's), and the embedding styles.

With pad=True a layout's padded rows/columns are zeros made on this rank (`Layout.padded_sizes`):
a padded colwise output unit is 0 and meets a zero rowwise column, so the sums are unchanged; a
gathered output drops its trailing padded features after the all-gather.

Parameters are built from this rank's slice only (`Layout.local_slice`): no weight collective is
issued and no full copy is made, so every rank must start with identical weights (loaded from one
checkpoint, or created under the same seed). With `weights_local=True` the parameters were already
placed by the loader as DTensors and only the forward is replaced.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from .. import quant
from .collectives import TpGroup, all_gather_last, all_reduce, local

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


STYLE_ATTR = "_dtp_style"  # on a Linear whose forward runs on local tensors: its LinearStyle
_LOCAL_CLASSES: dict[type, type] = {}  # nn.Linear (or a subclass) -> its subclass whose forward asks the style


def _style_forward(self, x):
    return self.__dict__[STYLE_ATTR].run(self, x)


def local_class(cls: type) -> type:
    """`cls` with a forward that runs `module._dtp_style.run(module, x)`: one class (and one `forward` function) for
    every sharded Linear of that type, so a compiled block traces the same code for all of them. (A per-module
    `functools.partial` as an instance `forward` is an object dynamo guards by id: one graph per block.)"""
    if cls not in _LOCAL_CLASSES:
        _LOCAL_CLASSES[cls] = type(cls.__name__, (cls,), {"forward": _style_forward, "__module__": cls.__module__})
    return _LOCAL_CLASSES[cls]


def install_forward(module: nn.Module, style) -> None:
    """`style.run` as `module`'s forward. A diffusers HookRegistry on the module (layerwise casting, a cache hook)
    has already replaced `module.forward` by its chain, whose innermost reference holds the forward it wrapped: ours
    goes there, so the registry's hooks still run around it (otherwise layerwise casting's fp8 weights would reach
    `F.linear` uncast)."""
    module.__dict__[STYLE_ATTR] = style
    refs = getattr(module.__dict__.get("_diffusers_hook"), "_fn_refs", None)
    if not refs:
        module.__class__ = local_class(type(module))
    elif refs[0].original_forward is not None:  # the innermost hook replaces the forward and calls the original
        refs[0].original_forward = partial(style.run, module)
    else:
        refs[0].forward = partial(style.run, module)


class LinearStyle(ParallelStyle):
    """One planned Linear: partition its parameters by their layouts, then run its forward on local tensors.

    `spec` is the resolved module (`resolve.linears.LinearSpec`): its `param_layouts()` say how each
    parameter is cut (`resolve.layout.Layout`, the one home of the slicing math). This base computes the
    colwise (and replicated) Linear: `F.linear` on the local weight and bias, no collective.
    """

    module_type = nn.Linear  # what `_apply` distributes (resolve refuses anything else)

    def __init__(self, spec, *, device=None, weights_local: bool = False):
        super().__init__()
        self.layouts = spec.param_layouts()
        self.device = device
        self.weights_local = weights_local
        self.tp: TpGroup | None = None  # set by `_apply`

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        assert isinstance(module, self.module_type), type(module)  # resolve refuses anything else
        self.tp = TpGroup(mesh)
        if quant.is_quantized(module.weight):  # distribute_module would try to broadcast the torchao subclass
            return quant.distribute_quantized(module, mesh, self._partition, self._input, self._output)
        self._partition("", module, mesh)
        install_forward(module, self)
        return module

    def run(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The Linear's forward on this rank's tensors (see the module docstring); a weight quantized after
        sharding (`dtp.quantize`: torchao's subclass around DTensors) goes through DTensor math instead."""
        weight, bias = module._parameters["weight"], module._parameters["bias"]  # what `module.weight` returns
        if not isinstance(weight, DTensor):
            return self._output(module, F.linear(self._input(module, (x,), self.tp.mesh)[0], weight, bias))
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return self.compute(x, weight.to_local(), local(bias))
        # `collectives.local` inlined (each Linear of a forward pays this path; every parameter here is a DTensor)
        return self.compute(x, weight._local_tensor, None if bias is None else bias._local_tensor)

    def compute(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def _partition(self, name, module: nn.Module, mesh) -> None:
        for param_name, param in list(module.named_parameters(recurse=False)):
            if self.weights_local:
                placed = isinstance(param.data, DTensor) or quant.is_quantized(param)  # quantized: DTensors inside
                assert placed, f"{name}.{param_name} was not placed by the loader"
                continue
            module.register_parameter(param_name, shard_parameter(param, self.layouts[param_name], mesh, self.device))

    # The DTensor path (quantized weights, embeddings): the input as a DTensor, the output redistributed.

    input_placement = Replicate()

    def _input(self, module, inputs, mesh):
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [self.input_placement], run_check=False)
        return (x, *inputs[1:])

    output_placement = Shard(-1)

    def _output(self, module, output, mesh=None):
        if not isinstance(output, DTensor):  # a forward that ran on local tensors (quant.dynamic)
            return output
        if output.placements != (self.output_placement,):
            output = output.redistribute(placements=[self.output_placement], async_op=False)
        return output.to_local()


class Colwise(LinearStyle):
    """colwise / packed_colwise: the output stays sharded by blocks (this rank's piece of each)."""


class Rowwise(LinearStyle):
    """rowwise / packed_rowwise: input sharded on its last dim; the partial sums are all-reduced, the (replicated)
    bias added once: by tp rank 0 to its partial sum, in its matmul (vLLM's `RowParallelLinear` does the same), so
    no op is added for it. Adding it on every rank before the reduce would count it tp times."""

    input_placement = Shard(-1)
    output_placement = Replicate()

    def compute(self, x, weight, bias):
        return all_reduce(F.linear(x, weight, bias if self.tp.rank == 0 else None), self.tp.group)


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

    def compute(self, x, weight, bias):
        y = all_gather_last(F.linear(x, weight, bias), self.tp.group, self.tp.size)
        return y if y.shape[-1] == self.width else y[..., : self.width]

    def _output(self, module, output, mesh=None):
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
