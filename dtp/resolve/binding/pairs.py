"""The pair rule: a sharded activation leaves a colwise layer and is consumed by a rowwise one.

Widths are how a pair is recognised: the blocks of a colwise output must each be the width of a
rowwise input block nearby, and the other way round. Attention is the one consumer that is not a
Linear: the q/k/v projections that are direct children of an attention module feed its attention
op, whose output (heads x head_dim, the width of q) is what the output projection takes. So their
widths follow the head counts (k/v narrower than q under GQA), and they only need a rowwise layer
in an enclosing module; the head bookkeeping (`heads.py`) checks that tp divides the heads.
"""

from __future__ import annotations

from ...errors import PlanError
from ...plan import Plan
from .linears import LinearSpec


def check_pairs(plan: Plan, linears: list[LinearSpec], attention_paths=()) -> None:
    """Each sharded output must meet a rowwise input of the same width in the nearest shared scope.

    A colwise output left sharded with no rowwise partner (or a rowwise layer fed by a replicated
    activation) runs without error on the wrong numbers, so we refuse it here. A gathered colwise
    layer is exempt both ways: its output is whole again, so it neither needs nor feeds a rowwise one.
    A colwise layer directly under one of `attention_paths` feeds attention, not a Linear: it needs
    a rowwise layer nearby, whatever its width.
    """
    attention_paths = set(attention_paths)
    linears = [s for s in linears if not s.style.gathers_output]
    col = [s for s in linears if s.style.shard_dim == 0]
    row = [s for s in linears if s.style.shard_dim == 1]
    for spec in row:
        _require_partner(plan, spec, col, "colwise", "its input")
    for spec in col:
        feeds_attention = spec.path.rpartition(".")[0] in attention_paths
        _require_partner(plan, spec, row, "rowwise", "its output", match_width=not feeds_attention)


def _require_partner(
    plan: Plan, spec: LinearSpec, others: list[LinearSpec], kind: str, side: str, *, match_width: bool = True
) -> None:
    scope, partners = nearest_scope(spec.path, others)
    if not partners:
        raise PlanError(
            f"plan {plan.name}, key '{spec.rule.key}': '{spec.path}' is {spec.style.value} but no {kind} layer in "
            f"an enclosing module consumes/produces {side}; a sharded activation needs a colwise -> rowwise pair."
        )
    widths = {size for p in partners for size in p.sizes}
    for size in spec.sizes if match_width else ():
        if size not in widths:
            raise PlanError(
                f"plan {plan.name}, key '{spec.rule.key}': width {size} of '{spec.path}' ({spec.style.value}) "
                f"matches no {kind} width in '{scope or '<model>'}' ({sorted(widths)}); fix the pair or the blocks."
            )


def nearest_scope(path: str, others: list[LinearSpec]) -> tuple[str, list[LinearSpec]]:
    atoms = path.split(".")
    for depth in range(len(atoms) - 1, -1, -1):
        scope = ".".join(atoms[:depth])
        prefix = f"{scope}." if scope else ""
        found = [o for o in others if o.path.startswith(prefix)]
        if found:
            return scope, found
    return "", []
