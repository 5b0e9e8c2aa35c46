"""Plan keys to module paths: `blocks.*.attn.to_q` over an `nn.ModuleList`, or one exact path (`blocks.-1`: the last
element of a ModuleList).

A rule's `optional: true` says "this module exists under some configs only": list elements that lack the member
are skipped (SD3's last block is context-only and sets `attn.to_add_out = None`; Mochi's last block has a
`norm1_context` without `linear`), and the rule may match nothing at all (Wan 2.2 Animate without
`added_kv_proj_dim`: `attn2.add_k_proj` is None and `attn2.norm_added_k` is never created; FramePack without
`has_image_proj`: `image_projection` is None). What keeps the flag from hiding a wrong key: a module that is
missing (not None) in every element must be one the code can create, i.e. the name is assigned as `self.<name>` in
the source file of the module that lacks it or of the model's class (`declared`). `attn2.norm_addedk` is in no such
file: a PlanError, optional or not. Elements lacking a member that others have are skipped as before (NucleusMoE's
dense blocks have `img_mlp.net`, its MoE blocks `img_mlp.experts`). An element that has the path but not as the
module kind the rule targets is checked by the caller.
"""

from __future__ import annotations

import ast
import functools
import inspect

from torch import nn

from ...errors import PlanError

_ABSENT = object()


def expand(model: nn.Module, key: str, plan_name: str, *, optional: bool = False) -> list[tuple[str, nn.Module]]:
    """`[(path, module)]` that `key` addresses; PlanError when the path or the glob is wrong."""
    if "*" not in key:
        path = _from_end(model, key)
        if optional and _optional_gap(model, "", path, model, key, plan_name):
            return []
        return [(path, _get(model, "", path, key, plan_name))]
    prefix, _, suffix = key.partition("*")
    prefix, suffix = prefix.rstrip("."), suffix.lstrip(".")
    if optional and prefix and _optional_gap(model, "", prefix, model, key, plan_name):
        return []
    container = _get(model, "", prefix, key, plan_name) if prefix else model
    if not isinstance(container, nn.ModuleList):
        raise PlanError(
            f"plan {plan_name}, key '{key}': `*` must expand over an nn.ModuleList, but '{prefix}' is a "
            f"{type(container).__name__}. Name the module without `*`."
        )
    if len(container) == 0:
        if optional:
            return []
        raise PlanError(f"plan {plan_name}, key '{key}': '{prefix}' is an empty ModuleList; the key matches nothing.")
    matches, missing = [], []
    for index, element in enumerate(container):
        base = f"{prefix}.{index}" if prefix else str(index)
        path = f"{base}.{suffix}" if suffix else base
        gap = _gap(element, base, suffix) if optional and suffix else None
        if gap is None:
            matches.append((path, _get(element, base, suffix, key, plan_name) if suffix else element))
        elif gap is not _NONE:
            missing.append(gap)
    # Elements that lack the member beside ones that have it are what `optional` is for (NucleusMoE's dense and
    # MoE blocks); a member no element has must be one the code creates.
    if not matches:
        for walked, holder, atom in missing:
            _require_declared(walked, holder, atom, model, key, plan_name)
    return matches


def attention_optional(plan, key: str) -> bool:
    """An `attention:` glob is optional when the `tp` rules under it all are (and there is one): the attention
    module exists under the configs that have its projections (ConsisID's `perceiver_cross_attention.*` only with
    `is_train_face`, Latte's `attn2` only with `cross_attention_dim`)."""
    under = [rule for rule in plan.rules if rule.key.startswith(f"{key}.")]
    return bool(under) and all(rule.optional for rule in under)


_NONE = object()  # `_gap`: the path stops at a None module


def _optional_gap(root: nn.Module, root_path: str, rel: str, model: nn.Module, key: str, plan_name: str) -> bool:
    """Whether `rel` under `root` stops at a module that is None or missing; a missing one must be `declared`."""
    gap = _gap(root, root_path, rel)
    if gap is not None and gap is not _NONE:
        _require_declared(*gap, model, key, plan_name)
    return gap is not None


def _gap(root: nn.Module, root_path: str, rel: str):
    """None when `rel` under `root` is a module all the way; `_NONE` when it stops at a None; else (walked path,
    the module lacking the atom, the atom)."""
    module, walked = root, root_path
    for atom in rel.split("."):
        walked = f"{walked}.{atom}" if walked else atom
        child = getattr(module, atom, _ABSENT)
        if child is None:
            return _NONE
        if not isinstance(child, nn.Module):
            return walked, module, atom
        module = child
    return None


def _require_declared(walked: str, holder: nn.Module, atom: str, model: nn.Module, key: str, plan_name: str):
    if declared(atom, holder, model):
        return
    child = getattr(holder, atom, _ABSENT)
    what = "does not exist" if child is _ABSENT else f"is a {type(child).__name__}, not a module"
    raise PlanError(
        f"plan {plan_name}, key '{key}': '{walked}' {what}, and no code of {type(holder).__name__} or "
        f"{type(model).__name__} creates a module '{atom}': check the path (`optional` skips modules that "
        f"some configs leave out, not a name that is wrong)."
    )


def declared(name: str, holder: nn.Module, model: nn.Module) -> bool:
    """Whether the source file of `holder`'s class (or a base's) or of the model's class assigns `self.<name>`: the
    module is one that some config creates (WanAttention's `norm_added_k` exists only with `added_kv_proj_dim`)."""
    classes = [c for c in type(holder).__mro__ if c.__module__.split(".")[0] not in ("torch", "builtins")]
    return any(name in _self_attributes(_source_file(c)) for c in (*classes, type(model)))


def _source_file(cls) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


@functools.lru_cache(maxsize=256)
def _self_attributes(path: str | None) -> frozenset[str]:
    """Names assigned as `self.<name> = ...` (or `setattr(self, "<name>", ...)`) anywhere in the file at `path`."""
    if path is None:
        return frozenset()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return frozenset(name for node in ast.walk(tree) if (name := _assigned_name(node)) is not None)


def _assigned_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
        return node.attr
    is_setattr = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) >= 2
    if is_setattr and _is_self(node.args[0]) and isinstance(node.args[1], ast.Constant):
        return node.args[1].value
    return None


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _get(root: nn.Module, root_path: str, rel: str, key: str, plan_name: str) -> nn.Module:
    module, walked = root, root_path
    for atom in rel.split("."):
        walked = f"{walked}.{atom}" if walked else atom
        child = module._modules.get(atom)
        if child is None:
            is_none = atom in module._modules or getattr(module, atom, _ABSENT) is None
            reason = "is None" if is_none else "does not exist"
            hint = " (mark the rule `optional: true` if some blocks or configs lack it)" if is_none else ""
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
