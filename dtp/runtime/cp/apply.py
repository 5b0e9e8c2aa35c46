"""Install context parallelism on a model: split/gather hooks and CP attention. After every check."""

from __future__ import annotations

from collections import defaultdict

import torch.distributed as dist
from torch import nn

from ...resolve.binding.cp import CpResolved
from .attention import CpAttention, install_attention
from .hooks import GatherOutput, PadState, SplitInputs, SplitOutputs

HANDLES_ATTR = "_dtp_cp_handles"


def apply_cp(model: nn.Module, resolved: CpResolved, cp_mesh, mode: str) -> None:
    """Hook `model` for CP on the 1-D `cp_mesh`; `remove_cp(model)` undoes it."""
    group = cp_mesh.get_group()
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    handles, pads = [], PadState()
    inputs, outputs = defaultdict(list), defaultdict(list)
    for path, rule in resolved.splits:
        (outputs if rule.output else inputs)[path].append(rule)
    for path, rules in inputs.items():
        module = model.get_submodule(path)
        hook = SplitInputs(path, module, rules, rank, cp, pads)
        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    for path, rules in outputs.items():
        handles.append(model.get_submodule(path).register_forward_hook(SplitOutputs(path, rules, rank, cp)))
    for path, rule in resolved.gathers:
        handles.append(model.get_submodule(path).register_forward_hook(GatherOutput(path, rule, group)))
    attention = CpAttention(mode=mode, group=group)
    padded = CpAttention(mode=mode, group=group, pads=pads)  # masks the pad keys of the padded split
    for spec in resolved.attention:
        chosen = padded if spec.path in resolved.padded_attention else attention
        handles += install_attention(spec.path, model.get_submodule(spec.path), chosen)
    setattr(model, HANDLES_ATTR, getattr(model, HANDLES_ATTR, []) + handles)


def remove_cp(model: nn.Module) -> None:
    """Remove every CP hook `apply_cp` installed; the model then runs its attention locally again."""
    for handle in getattr(model, HANDLES_ATTR, []):
        handle.remove()
    if hasattr(model, HANDLES_ATTR):
        delattr(model, HANDLES_ATTR)
