"""Tied weights: one Parameter shared by several planned modules (T5's `shared` and `encoder.embed_tokens`,
an `lm_head` tied to `embed_tokens`).

Each module's style cuts its own slice, which would leave every rank with one slice per module and
the modules no longer tied. So the ties are found before anything is mutated, and after sharding every
module of a group gets the first one's sharded Parameter back (`runtime/ties.py`). That is only the
same tensor when every member is cut the same way: a vocab_parallel `embed_tokens` ([V, d], rows
split) and a colwise_gathered `lm_head` ([V, d], rows split) are; a tie across different layouts is
refused. A tied Parameter that is planned in one module and left whole in another would keep the
full tensor alive as well: refused too, naming the module to add to the plan.
"""

from __future__ import annotations

from torch import nn

from ...errors import PlanError
from .linears import LinearSpec


def find_ties(model: nn.Module, specs: list[LinearSpec], plan_name: str) -> tuple[tuple[str, ...], ...]:
    """Groups of qualified parameter names (`path.weight`) that are one tied Parameter, planned modules only."""
    layouts = {f"{spec.path}.{name}": layout for spec in specs for name, layout in spec.param_layouts().items()}
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    ties = []
    for names in groups.values():
        planned = [n for n in names if n in layouts]
        if len(names) < 2 or not planned:
            continue
        whole = [n for n in names if n not in layouts]
        if whole:
            raise PlanError(
                f"plan {plan_name}: '{planned[0]}' is tied to '{whole[0]}' (one Parameter), which the plan leaves "
                f"whole, so every rank would keep the full tensor and sharding it saves nothing; add "
                f"'{whole[0].rpartition('.')[0]}' to the plan with the same style."
            )
        if len({layouts[n] for n in planned}) > 1:
            raise PlanError(
                f"plan {plan_name}: '{planned[0]}' and '{planned[1]}' are one tied Parameter but the plan cuts them "
                f"differently ({layouts[planned[0]]} vs {layouts[planned[1]]}); give them styles that split the same "
                f"dim."
            )
        ties.append(tuple(planned))
    return tuple(ties)
