"""ParallelStyle subclasses for the plan styles: torch's Colwise/RowwiseParallel with our slicing.

torch's styles shard a parameter with `distribute_tensor`, which first moves the whole tensor to the
device and broadcasts/scatters it from rank 0. Ours keep torch's forward hooks (input/output layouts
and the one all-reduce per colwise -> rowwise pair) but build each parameter from this rank's slice
only (`slicing.local_slice`), so:
  * no weight collective is issued and no full copy is made (every rank must hold the same
    weights beforehand: loaded from one checkpoint, or created under the same seed);
  * only the slice is moved to the mesh's device (`DTensor.from_local` moves the local tensor);
  * a parameter that is already a DTensor (placed by the loader) is left as it is.

Packed layouts are recorded on the parameter (`_dtp_layout = (dim, sizes)`) so the original tensor
can be reassembled with `slicing.assemble` (DTensor's `Shard` placement alone would put the blocks
in the wrong order).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from .plan import Style
from .slicing import assemble, local_slice

LAYOUT_ATTR = "_dtp_layout"


def shard_parameter(param: nn.Parameter, dim: int | None, sizes, mesh, device=None) -> nn.Parameter:
    """This rank's DTensor parameter: `Shard(dim)` of the block-wise slice, or `Replicate()` when dim is None.

    With `device`, the slice (not the full tensor) is moved there; otherwise `DTensor.from_local`
    moves it to the mesh's device type (the current device).
    """
    if isinstance(param.data, DTensor):
        return param
    local = param.data if dim is None else local_slice(param.data, dim, sizes, mesh.size(), mesh.get_local_rank())
    if device is not None:
        local = local.to(device)
    return local_parameter(local, dim, sizes, mesh, param.requires_grad)


def local_parameter(local: torch.Tensor, dim: int | None, sizes, mesh, requires_grad: bool = True) -> nn.Parameter:
    """Wrap this rank's tensor as a DTensor parameter: `Shard(dim)` of a block-wise slice (its
    layout recorded for `full_tensor`), or `Replicate()` when `dim` is None. No communication."""
    placement = Replicate() if dim is None else Shard(dim)
    param = nn.Parameter(DTensor.from_local(local, mesh, [placement], run_check=False), requires_grad=requires_grad)
    if dim is not None:
        setattr(param, LAYOUT_ATTR, (dim, tuple(sizes)))
    return param


def _partition(module: nn.Module, layouts: dict, mesh, device=None) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        layout = layouts[name]
        dim, sizes = layout if layout is not None else (None, None)
        module.register_parameter(name, shard_parameter(param, dim, sizes, mesh, device))


def _output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
    """torch's output hook, with the collective synchronous on CPU meshes.

    torch issues the output redistribute (all-reduce / all-gather) with `async_op=True`. Under gloo
    that was seen to corrupt the heap now and then ("malloc(): unaligned tcache chunk detected",
    then "Connection reset by peer" on the other ranks) with unwaited collectives at exit; on CPU
    there is no compute to overlap anyway. Accelerator meshes keep the asynchronous collective.
    """
    if outputs.placements != output_layouts:
        outputs = outputs.redistribute(placements=output_layouts, async_op=device_mesh.device_type != "cpu")
    return outputs.to_local() if use_local_output else outputs


class BlockColwise(ColwiseParallel):
    """colwise / packed_colwise: weight `[out, in]` and bias split by output blocks (Shard(0)).

    `y = x [W_1; ...; W_k]^T`: each rank computes its rows of every block, so its output is
    the concatenation of its piece of each fused projection (Q, K, V, gate, up ...).
    """

    def __init__(self, sizes, *, device=None, **kwargs):
        super().__init__(**kwargs)
        self.sizes = tuple(sizes)
        self.device = device

    _prepare_output_fn = staticmethod(_output_fn)

    def _partition_linear_fn(self, name, module, device_mesh):
        _partition(module, {"weight": (0, self.sizes), "bias": (0, self.sizes)}, device_mesh, self.device)


class BlockRowwise(RowwiseParallel):
    """rowwise / packed_rowwise: weight split by input blocks (Shard(1)); bias whole, added once after the all-reduce.

    `y = sum_r x_r W_r^T + b` where `x_r` is rank r's piece of each input block.
    """

    def __init__(self, sizes, *, device=None, **kwargs):
        super().__init__(**kwargs)
        self.sizes = tuple(sizes)
        self.device = device

    _prepare_output_fn = staticmethod(_output_fn)

    def _partition_linear_fn(self, name, module, device_mesh):
        _partition(module, {"weight": (1, self.sizes), "bias": None}, device_mesh, self.device)


class GatheredColwise(BlockColwise):
    """colwise_gathered: sharded like colwise, output all-gathered to the full feature order.

    `y = x W^T + b` with `W = [W_1; ...; W_tp]` (one block, contiguous rows per rank): rank r
    computes `y_r = x W_r^T + b_r`, and the all-gather along the last dim concatenates the `y_r` in
    rank order, which is exactly `y`. Used for Linears applied to few rows whose output every rank
    needs whole, e.g. AdaLN modulation (`[batch, 6 * dim]`, chunked into shift/scale/gate later):
    the weight costs 1/tp per rank and the all-gather moves only `batch * 6 * dim` values.
    """

    def __init__(self, sizes, *, device=None):
        assert len(tuple(sizes)) == 1, "a gathered output is only in full order for a single block"
        super().__init__(sizes, device=device, output_layouts=Replicate())


def style_for(spec, device=None) -> ColwiseParallel | RowwiseParallel:
    """The ParallelStyle for one resolved Linear (`resolve.LinearSpec`); slices go to `device` when given."""
    if spec.style is Style.COLWISE_GATHERED:
        return GatheredColwise(spec.sizes, device=device)
    if spec.style in (Style.COLWISE, Style.PACKED_COLWISE):
        return BlockColwise(spec.sizes, device=device)
    if spec.style in (Style.ROWWISE, Style.PACKED_ROWWISE):
        return BlockRowwise(spec.sizes, device=device)
    raise AssertionError(f"unhandled style {spec.style}")  # the Style enum is closed


def full_tensor(param) -> torch.Tensor:
    """The original (unsharded) tensor of a parameter sharded by these styles; gathers over the mesh."""
    if not isinstance(param, DTensor):
        return param.detach()
    layout = getattr(param, LAYOUT_ATTR, None)
    if layout is None:
        return param.full_tensor()
    dim, sizes = layout
    gathered = param.redistribute(placements=[Replicate()]).to_local()
    # redistribute() concatenates the rank pieces in rank order, which `assemble` reorders by block.
    tp = param.device_mesh.size()
    return assemble(list(torch.chunk(gathered, tp, dim=dim)), dim, sizes)
