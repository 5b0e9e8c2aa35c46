"""Install context parallelism on a model: split/gather hooks and CP attention. After every check."""

from __future__ import annotations

from collections import defaultdict

import torch.distributed as dist
from torch import nn

from ...resolve.binding.cp import CpResolved
from .attention import CpAttention, ScopeGuard, install_attention
from .batch_rows import install_batch_rows
from .expert_choice import install_expert_choice
from .forwards import CP_FORWARDS
from .framewise import Samples, install_frames
from .grid import install_grids
from .grid_embed import install_embeds
from .halo import install_halo
from .hooks import GatherOutput, PadState, SplitInputs, SplitOutputs
from .joint_embed import install_skip
from .kept import install_keeps
from .local_embed import install_local_embed, local_embed_for
from .masks import ForwardMasks
from .pad_view import PadView
from .per_sample import install_per_sample
from .root import RootHooks

HANDLES_ATTR = "_dtp_cp_handles"


def apply_cp(
    model: nn.Module, resolved: CpResolved, cp_mesh, mode: str, backend: str | None = None, usp: tuple | None = None
) -> None:
    """Hook `model` for CP on the 1-D `cp_mesh`; `remove_cp(model)` undoes it. backend: the attention backend
    (a diffusers `AttentionBackendName` value, None = auto) Ulysses and ring attention use (`CpAttention`)."""
    group = cp_mesh.get_group()
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    if usp is not None:  # a `make_mesh(cp=C, ulysses=U)` mesh: Ulysses inside each ring position
        mode = "usp"
    handles, pads = [], PadState()
    inputs, outputs = defaultdict(list), defaultdict(list)
    for path, rule in resolved.splits:
        (outputs if rule.output else inputs)[path].append(rule)
    guard = ScopeGuard()  # pops the attention scopes a raised forward left open
    masks = ForwardMasks()  # each mask split and gathered once per forward, reused by every layer
    root = RootHooks(pads, guard, masks)  # one pre-hook and one always_call hook for the three (`root.py`)
    handles.append(model.register_forward_pre_hook(root.open))  # first: ahead of the model's own split hook
    for path, rules in inputs.items():
        module = model.get_submodule(path)
        hook = SplitInputs(path, module, rules, rank, cp, pads)
        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    handles += install_embeds(model, resolved.embeds)  # after the splits: the rank's cut indices are embedded
    if resolved.forward is not None:  # dtp's forward for the class: it cuts before the forward's own joins
        handles.append(CP_FORWARDS[resolved.forward.name](model, resolved.forward, pads, rank, cp, group))
    framewise = [rule.frames_of for rules in outputs.values() for rule in rules if rule.frames_of is not None]
    samples = Samples(model, framewise)  # the batch of the inputs `frames_of` splits name, recorded per forward
    if framewise:
        handles.append(model.register_forward_pre_hook(samples.record, with_kwargs=True))
    for path, rules in outputs.items():
        module = model.get_submodule(path)
        local = local_embed_for(module, rules)  # computes the rank's tokens only, instead of cutting the whole
        if rules[0].frames_of is not None:  # the only rule of its module (`_check_frames`: output 0 alone)
            handles.append(install_frames(module, path, rules[0], samples, rank, cp, pads))
        elif rules[0].skip is not None:  # likewise
            handles.append(install_skip(module, path, rules[0], pads, rank, cp))
        elif local is not None:
            handles.append(install_local_embed(module, path, local, rank, cp))
        else:
            handles.append(module.register_forward_hook(SplitOutputs(path, rules, rank, cp, pads)))
    handles += install_keeps(model, resolved.keeps, pads, group, rank, cp)  # after the splits that record lengths
    for path, rule in resolved.gathers:
        handles.append(model.get_submodule(path).register_forward_hook(GatherOutput(path, rule, group, pads)))
    handles += install_grids(model, resolved.grids, pads, group, cp)  # output layers past the forward's own reshape
    handles.append(model.register_forward_hook(root.close, always_call=True))  # last, after the gathers, as before
    handles += _install_attentions(
        model, resolved, pads, dict(mode=mode, group=group, backend=backend, masks=masks, usp=usp)
    )
    for path, dim, rows in resolved.halos:  # convolutions over the split token grid (Sana's Mix-FFN)
        handles += install_halo(model.get_submodule(path), path, dim, rows, group, rank, cp)
    for path, _kind in resolved.gathered:  # choices over the whole sequence from gathered scores (one kind so far)
        handles += install_expert_choice(model.get_submodule(path), path, group)
    handles += install_per_sample(model, resolved.per_sample)  # `local` cross-attention, context once per sample
    handles += install_batch_rows(model, resolved.batch_rows, group, rank, cp)  # a share of a whole batch's rows
    setattr(model, HANDLES_ATTR, getattr(model, HANDLES_ATTR, []) + handles)


def _install_attentions(model: nn.Module, resolved: CpResolved, pads: PadState, shared: dict) -> list:
    """Each attention module's CP route: one `CpAttention` for unpadded keys, one masking the pad keys, and one per
    slot subset for an attention that sees one of two padded streams (`pad_view.py`); `shared`: their common options."""
    attention = CpAttention(**shared)
    padded = CpAttention(pads=pads, **shared)  # pad keys masked
    slots, views = dict(resolved.pad_slots), {}
    for at in slots.values():
        views.setdefault(at, CpAttention(pads=PadView(pads, at), **shared))
    handles = []
    for spec in resolved.attention:
        if spec.path in slots:
            chosen = views[slots[spec.path]]
        else:
            chosen = padded if spec.path in resolved.padded_attention else attention
        handles += install_attention(spec.path, model.get_submodule(spec.path), chosen)
    return handles


def remove_cp(model: nn.Module) -> None:
    """Remove every CP hook `apply_cp` installed; the model then runs its attention locally again."""
    for handle in getattr(model, HANDLES_ATTR, []):
        handle.remove()
    if hasattr(model, HANDLES_ATTR):
        delattr(model, HANDLES_ATTR)


def move_cp_hooks(model: nn.Module, base: nn.Module, wrapper: nn.Module) -> None:
    """Move the CP hooks `apply_cp` put on `base` to `wrapper`, a module that now calls `base` and adds to its output
    (peft's LoRA layer: `base(x) + B(A(x)) s`). Left on `base`, a split, keep or gather would apply to the base's
    output only, and the adapter's term, on the other sequence length, would not add up (FLUX.1's `proj_out` gathers;
    FramePack's keeps its last rows, then gathers them ragged). Every hook of ours is moved, whatever its kind: the
    ones whose handle `apply_cp` recorded, in the order they were registered."""
    handles = getattr(model, HANDLES_ATTR, [])
    kept = []
    for handle in handles:
        ref = getattr(handle, "hooks_dict_ref", None)  # torch's RemovableHandle; dtp's own handles (swapped
        hooks = ref() if ref is not None else None  # processors, forwards) stay as they are
        if hooks is base._forward_pre_hooks and handle.id in hooks:
            hook, with_kwargs = hooks.pop(handle.id), base._forward_pre_hooks_with_kwargs.pop(handle.id, False)
            kept.append(wrapper.register_forward_pre_hook(hook, with_kwargs=with_kwargs))
        elif hooks is base._forward_hooks and handle.id in hooks:
            hook, with_kwargs = hooks.pop(handle.id), base._forward_hooks_with_kwargs.pop(handle.id, False)
            always = base._forward_hooks_always_called.pop(handle.id, False)
            kept.append(wrapper.register_forward_hook(hook, with_kwargs=with_kwargs, always_call=always))
        else:
            kept.append(handle)
    setattr(model, HANDLES_ATTR, kept)
