"""plan + model -> `Resolved`: what to shard, what to rewrite, which numbers tp must divide. Mutates nothing.

`resolve(plan, model)` expands the globs, reads every target Linear's shape and packed blocks, finds
the attention modules whose head counts need rewriting and checks the colwise/rowwise pairing.
`Resolved.check_tp(tp)` then checks one TP degree; `Resolved.candidates()` lists the degrees that
pass. Only shapes and attributes are read, so a model on the meta device resolves as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...plan import Plan
from ..layout import Layout
from .constraints import Constraint, candidates, check_divides
from .embeddings import check_embeddings
from .heads import AttentionSpec, resolve_attention, width_constraints
from .linears import LinearSpec, resolve_linears
from .norms import NormSpec, resolve_norms
from .outputs import OutputSpec, resolve_outputs
from .pairs import check_pairs
from .ties import find_ties


@dataclass(frozen=True)
class Resolved:
    """A plan bound to one model: what to shard, what to rewrite, which numbers `tp` must divide."""

    plan: Plan
    linears: tuple[LinearSpec, ...]
    attention: tuple[AttentionSpec, ...]
    constraints: tuple[Constraint, ...]
    ties: tuple[tuple[str, ...], ...] = ()  # planned parameter names that are one tied Parameter (resolve/ties.py)
    norms: tuple[NormSpec, ...] = ()  # rmsnorm_across_heads modules (runtime/norms.py)
    outputs: tuple[OutputSpec, ...] = ()  # shard_output modules (runtime/outputs.py)

    def candidates(self) -> list[int]:
        """Every TP degree that divides all constraints: the divisors of their gcd."""
        return candidates(self.constraints)

    def check_tp(self, tp: int) -> None:
        """Raise PlanError naming the numbers `tp` does not divide (the first few, with their keys)."""
        check_divides(self.constraints, tp, self.plan.name)

    def param_layouts(self) -> dict[str, Layout | None]:
        """`{qualified param name: Layout or None}` for every parameter of every planned Linear and norm."""
        return {
            f"{spec.path}.{name}": layout
            for spec in (*self.linears, *self.norms)
            for name, layout in spec.param_layouts().items()
        }


def resolve(plan: Plan, model: nn.Module) -> Resolved:
    """Bind `plan` to `model` and run every check that does not depend on the TP degree."""
    linears = resolve_linears(plan, model)
    attention = resolve_attention(plan, model, linears)
    # The pair rule is about Linears; the embedding styles have their own check.
    check_pairs(plan, [s for s in linears if not s.style.is_embedding], [spec.path for spec in attention])
    check_embeddings(plan, linears, attention)
    norms = resolve_norms(plan, model, linears, [spec.path for spec in attention])
    outputs = resolve_outputs(plan, model)
    constraints = width_constraints(linears, attention) + [
        c for spec in (*attention, *norms) for c in spec.constraints()
    ]
    ties = find_ties(model, linears, plan.name)
    return Resolved(
        plan=plan,
        linears=tuple(linears),
        attention=tuple(attention),
        constraints=tuple(constraints),
        ties=ties,
        norms=tuple(norms),
        outputs=tuple(outputs),
    )
