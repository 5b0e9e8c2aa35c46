"""Planned `shard_output` modules: parameter-free modules whose outputs are cut to this rank's features.

Some models compute a per-feature table once and hand it to every attention module: LTX's RoPE
returns cos/sin of shape [B, S, heads * head_dim] that multiply q/k BEFORE the head split, Mochi's
returns [S, heads, head_dim / 2] per head. After colwise q/k each rank holds a contiguous piece of
the features (its heads), so the table must be cut the same way: `Layout(dim, (size,))`, rank r
keeping `[r * size / tp, (r + 1) * size / tp)`. The size is only known when the module runs, so tp
dividing it is checked then (ForwardError); the heads it follows are checked here already.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...errors import PlanError
from ...plan import Plan, Rule, Style
from .globs import expand


@dataclass(frozen=True)
class OutputSpec:
    """One module whose every output tensor is cut along `dim` (contiguous per rank)."""

    path: str
    rule: Rule

    @property
    def dim(self) -> int:
        return self.rule.dim


def resolve_outputs(plan: Plan, model: nn.Module) -> list[OutputSpec]:
    """One OutputSpec per module a `shard_output` rule addresses; PlanError for modules with parameters."""
    specs = []
    for rule in (r for r in plan.rules if r.style is Style.SHARD_OUTPUT):
        for path, module in expand(model, rule.key, plan.name, optional=rule.optional):
            if any(True for _ in module.parameters()):
                raise PlanError(
                    f"plan {plan.name}, key '{rule.key}': '{path}' ({type(module).__name__}) has parameters; "
                    f"'{rule.style.value}' cuts the outputs of parameter-free table modules (RoPE) only, "
                    f"a layer with weights needs a Linear style."
                )
            specs.append(OutputSpec(path=path, rule=rule))
    return specs
