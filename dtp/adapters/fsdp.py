"""LoRA on a model sharded with fsdp=True: adapters whole over the fsdp ranks, fuse written into FSDP's shards.

Between calls FSDP2 holds a base weight as rows [f c, (f + 1) c) of its tp slice on fsdp rank f of F
(c = ceil(rows / F), `runtime.fsdp.fsdp_rows`) and gathers the whole tp slice just before its block runs. The
adapter factors are tiny (rank r rows or columns), so every fsdp rank keeps them at their tp size, outside FSDP's
units: split over tp like their bases (`shard.py`), replicated over the fsdp ranks. The unfused forward
`y = base(x) + B(A(x)) s` then runs on the gathered base exactly as under TP alone, and `set_adapters`, disable,
enable and delete touch only the adapters.

    load   peft sizes a factor from its base's weight: between calls that is FSDP's row shard, so while peft builds
           its layers it is given each base's forward (in, out) (`forward_sizes`: the tp slice's, or whole)
    fuse   W_f += rows [f c, (f + 1) c) of (B A s), B A s taken at the tp slice's shape (peft's own
           `get_delta_weight`), added in place to FSDP's shard; `release` first, or the root's gathered weights
           and the first window's pending prefetch would give the next call the unfused values
    unfuse W_f -= the same rows

Example: FLUX.1 tiny on (cp=2, tp=2), rank-4 LoRA on `to_q` (64 -> 64, colwise): A [4, 64] whole, B [32, 4]
(this tp rank's rows), both on every cp rank; fused, cp rank f adds rows [16 f, 16 f + 16) of B A s to its
[16, 64] shard of the [32, 64] tp slice.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..errors import PlanError
from ..runtime.fsdp import fsdp_rows, release
from ..runtime.mesh import TP_AXIS
from .keys import LORA_KEY, base_linear

MERGED_INTO_SHARDS = "_dtp_fsdp_merge"  # on a peft LoRA layer whose merge / unmerge `merge_into_shards` wrapped


def check_lora_fsdp(peft_sd: dict, prefix) -> None:
    """PlanError for what the fsdp path does not load: a LoRA bias, which fuse would add to FSDP's bias shards."""
    for key in peft_sd:
        match = LORA_KEY.match(key)
        if match is not None and match["param"] == "bias":
            raise PlanError(
                f"LoRA key '{f'{prefix}.' if prefix else ''}{key}': dtp.load_lora on a model sharded with fsdp=True "
                f"loads plain LoRA factors only, without lora_B.bias (peft's lora_bias=True); load this LoRA with "
                f"fsdp=False, or fuse it with diffusers before sharding."
            )


def tp_submesh(mesh):
    """The tp axis of a base weight's mesh: FSDP2 keeps a TP-split weight on ("fsdp", "tp"); None without one."""
    if mesh is None or TP_AXIS not in (mesh.mesh_dim_names or ()):
        return None
    return mesh[TP_AXIS] if mesh.ndim > 1 else mesh


@contextlib.contextmanager
def forward_sizes(model: nn.Module, specs: dict, tp: int):
    """While peft builds its layers: each adapted base of `specs` (path -> LinearSpec or None) has the (in, out)
    features its forward sees (its tp slice; whole without TP), not those of FSDP's row shard that peft would read
    off the weight between calls. Through peft's per-layer sizing method (`LoraLayer._get_in_out_features`, which
    its own subclasses override), restored after; the model's parameters are not touched (FSDP2 re-checks them
    when peft loads the adapter's state dict)."""
    from peft.tuners.lora.layer import LoraLayer  # here: peft pulls in transformers, LoRA users only

    sizes = {
        id(base_linear(model, path)): _forward_features(base_linear(model, path), spec, tp)
        for path, spec in specs.items()
    }
    own = LoraLayer.__dict__["_get_in_out_features"]

    def sized(self, module):
        return sizes[id(module)] if id(module) in sizes else own(self, module)

    LoraLayer._get_in_out_features = sized
    try:
        yield
    finally:
        LoraLayer._get_in_out_features = own


def _forward_features(linear: nn.Linear, spec, tp: int) -> tuple[int, int]:
    """(in, out) of `linear` as its forward sees them: the tp slice's shape where TP splits it, else whole."""
    layout = None if spec is None else spec.param_layouts()["weight"]
    if layout is None or tp == 1:
        return linear.in_features, linear.out_features
    out_features, in_features = layout.local_shape((linear.out_features, linear.in_features), tp)
    return in_features, out_features


def merge_into_shards(model: nn.Module, layer: nn.Module) -> None:
    """Let peft's merge / unmerge of LoRA `layer` write into FSDP's shards of its base (the module docstring)."""
    if getattr(layer, MERGED_INTO_SHARDS, False):  # a second adapter on the same layer
        return
    setattr(layer, MERGED_INTO_SHARDS, True)
    full_delta = layer.get_delta_weight

    def shard_delta(adapter: str) -> DTensor:
        return _rows_of_shard(full_delta(adapter), layer.get_base_layer().weight)

    for name in ("merge", "unmerge"):
        method = getattr(layer, name)

        @functools.wraps(method)  # diffusers reads merge's signature (adapter_names)
        def into_shards(*args, method=method, **kwargs):
            release(model)
            layer.get_delta_weight = shard_delta
            try:
                if kwargs.get("safe_merge") or (args and args[0] is True):
                    _check_finite(layer, kwargs.get("adapter_names"))
                    args, kwargs = (), {**kwargs, "safe_merge": False}  # peft's safe path replaces FSDP's storage
                method(*args, **kwargs)
            finally:
                del layer.get_delta_weight  # peft's own method again

        setattr(layer, name, into_shards)


def _rows_of_shard(delta: torch.Tensor, weight: DTensor) -> DTensor:
    """This fsdp rank's rows of `delta` (at the tp slice's shape) as a DTensor laid out like FSDP's shard `weight`."""
    local = delta.to_local() if isinstance(delta, DTensor) else delta
    mesh = weight.device_mesh  # dim 0 is the fsdp axis (FSDP2's 2-D mesh puts tp second)
    start, stop = fsdp_rows(local.shape[0], mesh.size(0), mesh.get_local_rank(0))
    assert stop - start == weight.to_local().shape[0], (start, stop, weight.to_local().shape)
    return DTensor.from_local(
        local[start:stop].contiguous(),
        mesh,
        weight.placements,
        run_check=False,
        shape=weight.shape,
        stride=weight.stride(),
    )


def _check_finite(layer: nn.Module, adapter_names) -> None:
    """peft's safe_merge check (the merged weight is finite), on every rank's shard, every rank agreeing."""
    from peft.tuners.tuners_utils import check_adapters_to_merge  # here: peft pulls in transformers

    weight = layer.get_base_layer().weight
    for adapter in check_adapters_to_merge(layer, adapter_names):
        merged = weight.to_local() + layer.get_delta_weight(adapter).to_local()
        flag = torch.tensor([float(torch.isfinite(merged).all())], device=merged.device)
        for dim in range(weight.device_mesh.ndim):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=weight.device_mesh.get_group(dim))
        if flag.item() < 1:
            raise ValueError(f"NaNs detected in the merged weights. The adapter {adapter} seems to be broken")
