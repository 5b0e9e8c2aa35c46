"""Plan keys to module paths: `blocks.*.attn.to_q` over an `nn.ModuleList`, or one exact path.

With `optional=True` (a rule's `optional: true`), list elements whose member on the path is None
are skipped: SD3's last block is context-only and sets `attn.to_add_out = None`, `ff_context =
None`. Only None is tolerated: a member that does not exist is a typo, and a glob that skips every
element matches nothing; both stay PlanErrors.
"""

from __future__ import annotations

from torch import nn

from ..errors import PlanError

_ABSENT = object()


def expand(model: nn.Module, key: str, plan_name: str, *, optional: bool = False) -> list[tuple[str, nn.Module]]:
    """`[(path, module)]` that `key` addresses; PlanError when the path or the glob is wrong."""
    if "*" not in key:
        return [(key, _get(model, "", key, key, plan_name))]
    prefix, _, suffix = key.partition("*")
    prefix, suffix = prefix.rstrip("."), suffix.lstrip(".")
    container = _get(model, "", prefix, key, plan_name) if prefix else model
    if not isinstance(container, nn.ModuleList):
        raise PlanError(
            f"plan {plan_name}, key '{key}': `*` must expand over an nn.ModuleList, but '{prefix}' is a "
            f"{type(container).__name__}. Name the module without `*`."
        )
    if len(container) == 0:
        raise PlanError(f"plan {plan_name}, key '{key}': '{prefix}' is an empty ModuleList; the key matches nothing.")
    matches = []
    for index, element in enumerate(container):
        base = f"{prefix}.{index}" if prefix else str(index)
        path = f"{base}.{suffix}" if suffix else base
        if optional and _has_none_member(element, suffix):
            continue
        matches.append((path, _get(element, base, suffix, key, plan_name) if suffix else element))
    if not matches:
        raise PlanError(
            f"plan {plan_name}, key '{key}': the member is None in every element of '{prefix}'; the optional key "
            f"matches nothing. Remove it."
        )
    return matches


def _has_none_member(element: nn.Module, rel: str) -> bool:
    """True when some atom of `rel` under `element` is an attribute set to None (not a missing one)."""
    module = element
    for atom in rel.split(".") if rel else ():
        child = getattr(module, atom, _ABSENT)
        if child is None:
            return True
        if not isinstance(child, nn.Module):
            return False  # missing or not a module: `_get` raises with the full path
        module = child
    return False


def _get(root: nn.Module, root_path: str, rel: str, key: str, plan_name: str) -> nn.Module:
    module, walked = root, root_path
    for atom in rel.split("."):
        walked = f"{walked}.{atom}" if walked else atom
        child = module._modules.get(atom)
        if child is None:
            is_none = atom in module._modules or getattr(module, atom, _ABSENT) is None
            reason = "is None" if is_none else "does not exist"
            hint = " (mark the rule `optional: true` if some blocks lack it)" if reason == "is None" else ""
            raise PlanError(
                f"plan {plan_name}, key '{key}': module '{walked}' {reason}; check the path{hint} "
                f"(where blocks differ, list the ones that have it by index)."
            )
        module = child
    return module
