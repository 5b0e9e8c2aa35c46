"""diffusers' stateful hooks as the cfg axis sees them: whose state is per branch, whose is shared.

In one process a two-call pipeline runs `cache_context("cond")` then `cache_context("uncond")` each step.
A hook whose state lives in a `StateManager` keeps one state per context name (diffusers'
`_set_cache_context` addresses exactly those), so each branch's state only ever sees its own calls: the cfg
wrapper runs the predicted second call under the second call's context, and each group's branch state
evolves as in one process. A stateful hook without one (PyramidAttentionBroadcast, FasterCache's block
hooks) shares its state between the branches: the second call reads what the first one left, so both
calls must run on every group.

dtp's cache layer (`dtp/cache`) marks each hook it made rank-consistent with `BRANCH_ATTR`; a stateful
hook without the mark was installed behind dtp's back and is refused when the model runs.

Both checks run before every call, so they are read from a cache (`hook_view`) that is rebuilt only when a hook
was registered or removed anywhere (diffusers' `HookRegistry.register_hook` / `remove_hook` bump a counter, wrapped
once) or dtp marked one (`changed`): a walk over the model's modules per call costs ~1 ms of host time on FLUX.1.
"""

from __future__ import annotations

import functools

from torch import nn

BRANCH_ATTR = "_dtp_branch_state"  # on a diffusers hook dtp vouched for: PER_CONTEXT or SHARED
PER_CONTEXT, SHARED = "per_context", "shared"
VIEW_ATTR = "_dtp_hook_view"  # on a model: (hook generation, unvouched, sharing) when last walked

_generation = [0]  # bumped whenever a diffusers hook is registered or removed, or dtp marks one


def stateful_hooks(model: nn.Module) -> list[tuple[str, str, object]]:
    """(module path, hook name, hook) of every stateful diffusers hook under `model`."""
    return [
        (path or "<model>", name, hook)
        for path, module in model.named_modules()
        for name, hook in getattr(getattr(module, "_diffusers_hook", None), "hooks", {}).items()
        if getattr(hook, "_is_stateful", False)
    ]


def branch_state(hook) -> str:
    """PER_CONTEXT when the hook keeps its state in a diffusers StateManager (one state per context name)."""
    from diffusers.hooks.hooks import StateManager

    return PER_CONTEXT if any(isinstance(v, StateManager) for v in vars(hook).values()) else SHARED


def unvouched(model: nn.Module) -> list[str]:
    """`path: hook` of every stateful hook dtp's cache layer did not make rank-consistent."""
    return [f"{path}: {name}" for path, name, hook in stateful_hooks(model) if getattr(hook, BRANCH_ATTR, None) is None]


def sharing(model: nn.Module) -> str | None:
    """SHARED when any vouched hook shares its state between branches, PER_CONTEXT when some hook keeps one
    state per context, None without stateful hooks."""
    states = {getattr(hook, BRANCH_ATTR, None) for _, _, hook in stateful_hooks(model)}
    return SHARED if SHARED in states else (PER_CONTEXT if states else None)


def changed() -> None:
    """A hook was added, removed or marked: every model's cached view is stale."""
    _generation[0] += 1


def hook_view(model: nn.Module) -> tuple[list[str], str | None]:
    """(`unvouched(model)`, `sharing(model)`), walked again only when some hook changed since the last walk."""
    _track_registries()
    cached = vars(model).get(VIEW_ATTR)
    if cached is None or cached[0] != _generation[0]:
        cached = (_generation[0], unvouched(model), sharing(model))
        vars(model)[VIEW_ATTR] = cached
    return cached[1], cached[2]


@functools.cache
def _track_registries() -> None:
    """Wrap diffusers' `HookRegistry.register_hook` / `remove_hook` (once per process) to call `changed`."""
    from diffusers.hooks.hooks import HookRegistry

    for name in ("register_hook", "remove_hook"):
        original = getattr(HookRegistry, name)

        @functools.wraps(original)
        def tracked(self, *args, _original=original, **kwargs):
            changed()
            try:
                return _original(self, *args, **kwargs)
            finally:
                changed()

        setattr(HookRegistry, name, tracked)
