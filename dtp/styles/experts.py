"""experts: a mixture of SwiGLU experts held as two 3-D parameters, every expert split like an MLP pair.

The target holds `gate_up_proj` [E, H, 2I] (each expert's gate and up columns, fused: `x @ gate_up_proj[e]`
then `chunk(2)`) and `down_proj` [E, I, H] (diffusers' `SwiGLUExperts` of NucleusMoE; the transformers MoE
convention). No nn.Linear to hook, and one fused 3-D weight, so the Linear styles cannot express it. Each
rank holds a slice of every expert, never whole experts:

    gate_up_proj  Layout(2, (I, I)): columns [r I/tp, (r+1) I/tp) of the gate block and of the up block
    down_proj     Layout(1, (I,)):   the matching rows
    y = sum_r (silu(x G_r) * (x U_r)) D_r        one all-reduce of the expert output per call

Exact for any routing: the router runs replicated on whole activations, so every rank sends the same
tokens to the same experts and issues the same collective; the split is along the expert's hidden
units, which the SwiGLU treats independently. Example: NucleusMoE (E = 128, H = 2048, I = 1344) at
tp = 8: each rank holds 168 gate, 168 up and 168 down units of all 128 experts.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle

from .base import Style, register_style
from .collectives import TpGroup, all_reduce, local
from .parallel import shard_parameter

PARAMS = ("gate_up_proj", "down_proj")  # the two 3-D parameters, in the order the forward uses them


def expert_widths(module) -> tuple[int, int, int] | None:
    """(experts E, model width H, hidden units I) when `module` holds SwiGLU experts, else None."""
    gate_up, down = (getattr(module, name, None) for name in PARAMS)
    if not all(isinstance(p, nn.Parameter) and p.dim() == 3 for p in (gate_up, down)):
        return None
    experts, width, fused = gate_up.shape
    if fused % 2 or tuple(down.shape) != (experts, fused // 2, width):
        return None
    return experts, width, fused // 2


class ExpertsStyle(Style):
    name = "experts"
    shard_dim = 2  # gate_up_proj's columns; down_proj is split along dim 1 (its spec's param_layouts)
    role = "whole"  # its output leaves whole (all-reduced): pairs with nothing
    packed = True  # gate_up_proj's columns are two blocks, gate and up, each split on its own
    collective = "all_reduce"

    def accepts(self, module) -> str | None:
        if expert_widths(module) is not None:
            return None
        return (
            "not a module of SwiGLU experts; 'experts' needs 3-D parameters gate_up_proj [E, H, 2I] and "
            "down_proj [E, I, H]"
        )

    def parallel_style(self, spec, *, device=None, weights_local: bool = False):
        return ExpertsParallel(spec, device=device, weights_local=weights_local)


class ExpertsParallel(ParallelStyle):
    """Shard the two parameters by their layouts (DTensors, like every planned weight); the forward reads their
    local pieces and the output is all-reduced.

    The module's own forward (diffusers' code) does `self.gate_up_proj[e]`, `matmul` and `chunk(2)`: on a DTensor
    the chunk would cut the global (rank-interleaved) columns, so it must see the plain local tensors. A pre-hook
    puts each local piece in the instance `__dict__`, where attribute lookup finds it before `nn.Module.__getattr__`
    reaches `_parameters` (which keeps the DTensor for state dicts, loading and `full_tensor`); the hook after the
    forward removes it (a fresh view each call, so a later `.to(device)` is followed) and all-reduces the output.
    """

    def __init__(self, spec, *, device=None, weights_local: bool = False):
        super().__init__()
        self.layouts = spec.param_layouts()
        self.device = device
        self.weights_local = weights_local

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        for name in PARAMS:
            param = module._parameters[name]
            if self.weights_local:
                assert isinstance(param.data, DTensor), f"{name} was not placed by the loader"
                continue
            module.register_parameter(name, shard_parameter(param, self.layouts[name], mesh, self.device))
        module.register_forward_pre_hook(_local_views)
        module.register_forward_hook(partial(_reduce_output, tp=TpGroup(mesh)))
        return module


def _local_views(module: nn.Module, args) -> None:
    for name in PARAMS:
        module.__dict__[name] = local(module._parameters[name])


def _reduce_output(module: nn.Module, args, output, *, tp: TpGroup):
    for name in PARAMS:
        module.__dict__.pop(name, None)
    # The partial sums of this rank's hidden units, summed in place (the forward's fresh output; collectives.py).
    return all_reduce(output, tp.group)


register_style(ExpertsStyle, "EXPERTS")
