"""Plan keys to module paths: `blocks.*.attn.to_q` over an `nn.ModuleList`, or one exact path."""

from __future__ import annotations

from torch import nn

from ..errors import PlanError


def expand(model: nn.Module, key: str, plan_name: str) -> list[tuple[str, nn.Module]]:
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
        matches.append((path, _get(element, base, suffix, key, plan_name) if suffix else element))
    return matches


def _get(root: nn.Module, root_path: str, rel: str, key: str, plan_name: str) -> nn.Module:
    module, walked = root, root_path
    for atom in rel.split("."):
        walked = f"{walked}.{atom}" if walked else atom
        child = module._modules.get(atom)
        if child is None:
            reason = "is None" if atom in module._modules else "does not exist"
            raise PlanError(
                f"plan {plan_name}, key '{key}': module '{walked}' {reason}; check the path "
                f"(where blocks differ, list the ones that have it by index)."
            )
        module = child
    return module
