"""transformers' tensor-parallel plans (`base_model_tp_plan`, `_tp_plan`) read into dtp rules.

A transformers model carries a plan in its own vocabulary: `config.base_model_tp_plan` (keys relative
to the base model) and a class `_tp_plan` (the head, e.g. `{"lm_head": "colwise_gather_output"}`);
`post_init` merges both into the instance's `_tp_plan` with full prefixes. Its values name
transformers' ParallelStyles, not dtp's: `colwise_gather_output` is dtp's `colwise_gathered`,
`embedding_rowwise` is `vocab_parallel`. So a class attribute named `_tp_plan` is only read as a
diffusers plan for a diffusers `ModelMixin`; a transformers `PreTrainedModel` goes through
`translate` below. Which library a model comes from is decided by its class, never by attribute names.

Translated exactly: colwise, rowwise, colwise_gather_output / colwise_rep (-> colwise_gathered),
embedding_rowwise (-> vocab_parallel), packed_colwise (-> packed_colwise with blocks [1, 1]: a fused
[gate | up], transformers' split_factor 2). Dropped: replicated_with_grad_allreduce and replicate
(dtp leaves unplanned modules whole on every rank, which is what they ask for at inference).
Refused with the key named: everything else (their semantics differ from any dtp style, e.g.
`embedding_colwise` gathers its output where dtp's keeps it sharded).
"""

from __future__ import annotations

import sys

from ..errors import PlanError
from .plan import Plan

TRANSLATED = {
    "colwise": "colwise",
    "rowwise": "rowwise",
    "colwise_gather_output": "colwise_gathered",
    "colwise_rep": "colwise_gathered",
    "embedding_rowwise": "vocab_parallel",
    "packed_colwise": {"style": "packed_colwise", "blocks": [1, 1]},
}
DROPPED = frozenset({"replicated_with_grad_allreduce", "replicate"})


def is_transformers_model(model) -> bool:
    """`model` is a transformers PreTrainedModel (if transformers was never imported, it cannot be one)."""
    return _is_instance(model, "transformers", "PreTrainedModel")


def is_diffusers_model(model) -> bool:
    """`model` is a diffusers ModelMixin."""
    return _is_instance(model, "diffusers", "ModelMixin")


def _is_instance(model, package: str, base: str) -> bool:
    module = sys.modules.get(package)
    return module is not None and isinstance(model, getattr(module, base))


def translate(tp_plan: dict, name: str) -> Plan:
    """A dtp Plan from a transformers `_tp_plan` dict; PlanError naming the first key dtp cannot do exactly.

    >>> translate({"embed_tokens": "embedding_rowwise", "lm_head": "colwise_gather_output"}, "x").rules[1].style
    <Style.COLWISE_GATHERED: 'colwise_gathered'>
    """
    rules = {}
    for key, value in tp_plan.items():
        if value in DROPPED:
            continue
        if not isinstance(value, str) or value not in TRANSLATED:
            raise PlanError(
                f"plan {name}: key '{key}': transformers style {value!r} has no exact dtp equivalent (dtp translates "
                f"{', '.join(sorted(TRANSLATED))}; drops {', '.join(sorted(DROPPED))}). Write a dtp YAML plan for "
                f"this model and pass it as `plan=`."
            )
        rules[key] = TRANSLATED[value]
    if not rules:
        raise PlanError(f"plan {name}: every entry replicates; nothing to shard. Write a dtp YAML plan.")
    return Plan.from_dict({"tp": rules}, name=name)


def transformers_plan(model) -> Plan | None:
    """The model's own transformers plan (instance `_tp_plan`, merged by post_init), translated; None if it has none."""
    tp_plan = getattr(model, "_tp_plan", None) or {}
    if not tp_plan:
        base = getattr(model, "base_model", model)
        tp_plan = dict(getattr(getattr(base, "config", None), "base_model_tp_plan", None) or {})
    return translate(tp_plan, f"{type(model).__name__}._tp_plan (transformers)") if tp_plan else None
