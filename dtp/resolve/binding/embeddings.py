"""Checks for the embedding styles that the pair rule (pairs.py, for Linears) does not cover.

`vocab_parallel` leaves its output whole (all-reduced), so it needs no partner. `embedding_colwise`
leaves its output sharded along the embedding dim; dtp supports it for one consumer only: a
per-head bias table (T5/UMT5 `relative_attention_bias`, `[num_buckets, heads]`) owned by an
attention module whose heads are sharded, so that rank r's columns are exactly its local heads.
Example: T5-XXL, 64 heads at tp=8: rank 3 keeps bias columns 24:32, the heads of its q/k/v rows.
"""

from __future__ import annotations

from ...errors import PlanError
from ...plan import Plan, Style
from .heads import AttentionSpec
from .linears import LinearSpec


def check_embeddings(plan: Plan, specs: list[LinearSpec], attention: list[AttentionSpec]) -> None:
    """PlanError for an `embedding_colwise` layer that is not a per-head table of a sharded attention module."""
    heads = {spec.path: dict(spec.values + spec.checked) for spec in attention}
    for spec in specs:
        if spec.style is not Style.EMBEDDING_COLWISE:
            continue
        owner = spec.path.rpartition(".")[0]
        counts = heads.get(owner)
        if counts is None:
            raise PlanError(
                f"plan {plan.name}, key '{spec.rule.key}': '{spec.path}' is embedding_colwise, but its parent "
                f"'{owner or '<model>'}' is no attention module with sharded heads; embedding_colwise is for per-head "
                f"bias tables (T5's relative_attention_bias) only."
            )
        num_heads = counts.get("heads", counts.get("n_heads", counts.get("num_heads")))
        if sum(spec.sizes) != num_heads:
            raise PlanError(
                f"plan {plan.name}, key '{spec.rule.key}': '{spec.path}' has {sum(spec.sizes)} columns but '{owner}' "
                f"has {num_heads} heads; an embedding_colwise table needs one column per head."
            )
