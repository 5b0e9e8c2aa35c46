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
"""

from __future__ import annotations

from torch import nn

BRANCH_ATTR = "_dtp_branch_state"  # on a diffusers hook dtp vouched for: PER_CONTEXT or SHARED
PER_CONTEXT, SHARED = "per_context", "shared"


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
