"""Plan keys to module paths: `blocks.*.attn.to_q` over an `nn.ModuleList`, or one exact path (`blocks.-1`: the last
element of a ModuleList).

With `optional=True` (a rule's `optional: true`), list elements that lack the member on the path
are skipped: SD3's last block is context-only and sets `attn.to_add_out = None`, `ff_context =
None`; Mochi's last block has a different `norm1_context` without `linear`. Two cases stay
PlanErrors, so the flag never hides a wrong key: a member that no element has as a module and at
least one element lacks outright (a typo), and an element that has the path but not as the module
kind the rule targets (checked by the caller). A member that is None in every element is fine:
SD3.5-Large has no dual-attention `attn2` in any block, SD3.5-Medium in blocks 0-12.
"""

from __future__ import annotations

from torch import nn

from ...errors import PlanError

_ABSENT = object()


def expand(model: nn.Module, key: str, plan_name: str, *, optional: bool = False) -> list[tuple[str, nn.Module]]:
    """`[(path, module)]` that `key` addresses; PlanError when the path or the glob is wrong."""
    if "*" not in key:
        path = _from_end(model, key)
        return [(path, _get(model, "", path, key, plan_name))]
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
    matches, lacking = [], []
    for index, element in enumerate(container):
        base = f"{prefix}.{index}" if prefix else str(index)
        path = f"{base}.{suffix}" if suffix else base
        if optional:
            member = _member(element, suffix)
            if member is None or member is _ABSENT:
                lacking.append((path, member))
                continue
        matches.append((path, _get(element, base, suffix, key, plan_name) if suffix else element))
    if not matches and any(member is _ABSENT for _, member in lacking):
        raise PlanError(
            f"plan {plan_name}, key '{key}': no element of '{prefix}' has '{suffix}' (e.g. '{lacking[0][0]}' does "
            f"not exist); `optional` skips blocks that lack a member, not a path that is wrong everywhere."
        )
    return matches


def _member(element: nn.Module, rel: str):
    """The module at `rel` under `element`, None when an atom on the way is None, `_ABSENT` when one is missing."""
    module = element
    for atom in rel.split("."):
        child = getattr(module, atom, _ABSENT)
        if child is None or not isinstance(child, nn.Module):
            return None if child is None else _ABSENT
        module = child
    return module


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


def _from_end(model: nn.Module, key: str) -> str:
    """`key` with each negative index into an `nn.ModuleList` made positive: `blocks.-1` is the last block whatever
    the config's depth (Kandinsky 5 gathers at its last visual block's output). Other atoms are left to `_get`."""
    module, atoms = model, []
    for atom in key.split("."):
        if isinstance(module, nn.ModuleList) and atom.startswith("-") and atom[1:].isdigit() and len(module):
            atom = str(len(module) - int(atom[1:])) if int(atom[1:]) <= len(module) else atom
        atoms.append(atom)
        module = module._modules.get(atom) if module is not None else None
    return ".".join(atoms)
