"""plan + model -> per-module shard specs, with every structural check. Mutates nothing.

`resolve(plan, model)` expands the globs, reads every target Linear's shape and packed blocks, finds
the attention modules whose head counts need rewriting and checks the colwise/rowwise pairing.
`Resolved.check_tp(tp)` then checks one TP degree; `Resolved.candidates()` lists the degrees that
pass. Only shapes and attributes are read, so a model on the meta device resolves as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from .errors import PlanError
from .heads import AttentionSpec, attention_spec
from .plan import PACKED_BLOCKS_ATTR, Plan, Rule, Style
from .resolve_types import Constraint
from .slicing import block_sizes

_SHOWN = 3  # failing constraints named in a check_tp error


@dataclass(frozen=True)
class LinearSpec:
    """One planned Linear: its path, the rule that matched it, and its blocks along the split dim."""

    path: str
    rule: Rule
    sizes: tuple[int, ...]  # absolute block sizes along `rule.style.shard_dim`
    has_bias: bool

    @property
    def style(self) -> Style:
        return self.rule.style

    def param_layouts(self) -> dict[str, tuple[int, tuple[int, ...]] | None]:
        """`{param name: (dim, block sizes)}`, `None` for a parameter every rank holds whole."""
        layouts = {"weight": (self.style.shard_dim, self.sizes)}
        if self.has_bias:
            layouts["bias"] = (0, self.sizes) if self.style.splits_bias else None
        return layouts


@dataclass(frozen=True)
class Resolved:
    """A plan bound to one model: what to shard, what to rewrite, which numbers `tp` must divide."""

    plan: Plan
    linears: tuple[LinearSpec, ...]
    attention: tuple[AttentionSpec, ...]
    constraints: tuple[Constraint, ...]

    def candidates(self) -> list[int]:
        """Every TP degree that divides all constraints: the divisors of their gcd."""
        g = 0
        for c in self.constraints:
            g = math.gcd(g, c.value)
        return [d for d in range(1, g + 1) if g % d == 0] if g else [1]

    def check_tp(self, tp: int) -> None:
        """Raise PlanError naming the numbers `tp` does not divide (the first few, with their keys)."""
        if not isinstance(tp, int) or tp < 1:
            raise PlanError(f"plan {self.plan.name}: tp must be a positive integer, got {tp!r}.")
        failed = [c for c in self.constraints if c.value % tp]
        if not failed:
            return
        shown = "; ".join(f"{c.what}={c.value} (key '{c.key}')" for c in failed[:_SHOWN])
        more = f"; and {len(failed) - _SHOWN} more" if len(failed) > _SHOWN else ""
        supported = ", ".join(map(str, self.candidates()))
        raise PlanError(f"plan {self.plan.name}: tp={tp} does not divide {shown}{more}. Supported tp: {supported}.")

    def param_layouts(self) -> dict[str, tuple[int, tuple[int, ...]] | None]:
        """`{qualified param name: (dim, sizes) or None}` for every parameter of every planned Linear."""
        return {
            f"{spec.path}.{name}": layout
            for spec in self.linears
            for name, layout in spec.param_layouts().items()
        }


def resolve(plan: Plan, model: nn.Module) -> Resolved:
    """Bind `plan` to `model` and run every check that does not depend on the TP degree."""
    linears = _resolve_linears(plan, model)
    attention = _resolve_attention(plan, model, linears)
    _check_pairs(plan, linears)
    constraints = [c for spec in linears for c in _linear_constraints(spec)]
    constraints += [c for spec in attention for c in spec.constraints()]
    return Resolved(plan=plan, linears=tuple(linears), attention=tuple(attention), constraints=tuple(constraints))


def resolve_for_tp(plan: Plan, model: nn.Module, tp: int) -> Resolved:
    resolved = resolve(plan, model)
    resolved.check_tp(tp)
    return resolved


# ---------------------------------------------------------------------------------------------
# globs


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


# ---------------------------------------------------------------------------------------------
# linears


def _resolve_linears(plan: Plan, model: nn.Module) -> list[LinearSpec]:
    specs: dict[str, LinearSpec] = {}
    for rule in plan.rules:
        for path, module in expand(model, rule.key, plan.name):
            if not isinstance(module, nn.Linear):
                raise PlanError(
                    f"plan {plan.name}, key '{rule.key}': '{path}' is a {type(module).__name__}, not an nn.Linear; "
                    f"'{rule.style.value}' applies to Linear layers only."
                )
            if path in specs:
                raise PlanError(
                    f"plan {plan.name}: '{path}' is matched by both '{specs[path].rule.key}' and '{rule.key}'."
                )
            specs[path] = LinearSpec(path, rule, _sizes(plan, rule, path, module), module.bias is not None)
    return list(specs.values())


def _sizes(plan: Plan, rule: Rule, path: str, linear: nn.Linear) -> tuple[int, ...]:
    dim_size = linear.weight.shape[rule.style.shard_dim]
    if not rule.style.is_packed:
        return (dim_size,)
    blocks = rule.blocks
    if blocks is None:
        attr = PACKED_BLOCKS_ATTR[rule.style]
        blocks = getattr(linear, attr, None)
        if not blocks:
            raise PlanError(
                f"plan {plan.name}, key '{rule.key}': '{path}' is '{rule.style.value}' but has no blocks; give "
                f"`blocks:` in the plan or set `{attr}` on the Linear."
            )
    try:
        return block_sizes(dim_size, blocks)
    except ValueError:
        raise PlanError(
            f"plan {plan.name}, key '{rule.key}': blocks {list(blocks)} (sum {sum(blocks)}) do not divide "
            f"dim {rule.style.shard_dim} of '{path}' (size {dim_size}); blocks are proportions whose sum divides "
            f"the dim, or absolute sizes that add up to it."
        ) from None


def _linear_constraints(spec: LinearSpec) -> list[Constraint]:
    if len(spec.sizes) == 1:
        return [Constraint(spec.sizes[0], f"dim {spec.style.shard_dim} of {spec.path}", spec.rule.key)]
    # Every block on its own: a sum that divides is not enough (the ranks would cut across blocks).
    return [
        Constraint(size, f"packed block {i} (of {list(spec.sizes)}) of {spec.path}", spec.rule.key)
        for i, size in enumerate(spec.sizes)
    ]


# ---------------------------------------------------------------------------------------------
# attention modules


def _resolve_attention(plan: Plan, model: nn.Module, linears: list[LinearSpec]) -> list[AttentionSpec]:
    """The attention modules whose head bookkeeping must follow the sharded projections."""
    owners = _attention_owners(model, linears)
    if plan.attention is None:
        return [attention_spec(path, model.get_submodule(path), "<inferred>") for path in owners]
    listed: dict[str, AttentionSpec] = {}
    for key in plan.attention:
        for path, module in expand(model, key, plan.name):
            spec = attention_spec(path, module, key)
            if spec is None:
                raise PlanError(
                    f"plan {plan.name}, attention '{key}': '{path}' ({type(module).__name__}) has no integer "
                    f"`heads` attribute; list attention modules only."
                )
            listed[path] = spec
    missing = [path for path in owners if path not in listed]
    if missing:
        raise PlanError(
            f"plan {plan.name}: attention module '{missing[0]}' owns sharded projections but is not listed under "
            f"`attention`, so its head count would stay global (silently wrong output). Add its glob to `attention`."
        )
    return list(listed.values())


def _attention_owners(model: nn.Module, linears: list[LinearSpec]) -> list[str]:
    """Paths of the nearest ancestors with an integer `heads` attribute of every sharded Linear."""
    owners: dict[str, None] = {}
    for spec in linears:
        if spec.style.gathers_output:  # its output is whole: the head layout downstream is unchanged
            continue
        atoms = spec.path.split(".")
        for depth in range(len(atoms) - 1, 0, -1):
            path = ".".join(atoms[:depth])
            if attention_spec(path, model.get_submodule(path), "") is not None:
                owners[path] = None
                break
    return list(owners)


# ---------------------------------------------------------------------------------------------
# colwise/rowwise pairing


def _check_pairs(plan: Plan, linears: list[LinearSpec]) -> None:
    """Each sharded output must meet a rowwise input of the same width in the nearest shared scope.

    A colwise output left sharded with no rowwise partner (or a rowwise layer fed by a replicated
    activation) runs without error on the wrong numbers, so we refuse it here. A gathered colwise
    layer is exempt both ways: its output is whole again, so it neither needs nor feeds a rowwise one.
    """
    linears = [s for s in linears if not s.style.gathers_output]
    col = [s for s in linears if s.style.shard_dim == 0]
    row = [s for s in linears if s.style.shard_dim == 1]
    for spec in row:
        _require_partner(plan, spec, col, "colwise", "its input")
    for spec in col:
        _require_partner(plan, spec, row, "rowwise", "its output")


def _require_partner(plan: Plan, spec: LinearSpec, others: list[LinearSpec], kind: str, side: str) -> None:
    scope, partners = _nearest_scope(spec.path, others)
    if not partners:
        raise PlanError(
            f"plan {plan.name}, key '{spec.rule.key}': '{spec.path}' is {spec.style.value} but no {kind} layer in "
            f"an enclosing module consumes/produces {side}; a sharded activation needs a colwise -> rowwise pair."
        )
    widths = {size for p in partners for size in p.sizes}
    for size in spec.sizes:
        if size not in widths:
            raise PlanError(
                f"plan {plan.name}, key '{spec.rule.key}': width {size} of '{spec.path}' ({spec.style.value}) "
                f"matches no {kind} width in '{scope or '<model>'}' ({sorted(widths)}); fix the pair or the blocks."
            )


def _nearest_scope(path: str, others: list[LinearSpec]) -> tuple[str, list[LinearSpec]]:
    atoms = path.split(".")
    for depth in range(len(atoms) - 1, -1, -1):
        scope = ".".join(atoms[:depth])
        prefix = f"{scope}." if scope else ""
        found = [o for o in others if o.path.startswith(prefix)]
        if found:
            return scope, found
    return "", []
