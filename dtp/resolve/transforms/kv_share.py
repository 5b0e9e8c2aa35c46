"""Shared kv heads: GQA attention with fewer kv heads than ranks, each kv head held by tp / kv ranks (as vLLM does).

With K kv heads and tp = R * K ranks, the H / K query heads of kv head g (group g) are split over
the R ranks g R, ..., g R + R - 1, and each of those ranks holds kv head g whole:

    q_proj rows, o_proj columns    Layout(groups=K): group g's rows on ranks g R .. g R + R - 1 (plain
                                   contiguous rows when tp divides H; with pad=True each group is
                                   zero-padded to a multiple of R heads on its own, `padding.py`)
    k_proj, v_proj rows (+ bias)   Layout(replicas=R): rank r holds kv head r // R
    module counts                  num_key_value_heads -> 1, num_key_value_groups -> local query heads

Exact: rank r computes softmax(q_i k_g^T / sqrt(d)) v_g for its own query heads i of group g, the
numbers one device computes for them; o_proj's all-reduce sums the heads as before. The cost is
k/v weights held R times over (vLLM's trade); no collective is added.

Example: Qwen2.5-VL-7B (Qwen-Image's text encoder), 28 query / 4 kv heads of 128, tp = 8, pad=True:
each group of 7 pads to 8, so rank 5 holds query heads 18-20 plus one zero head, and kv head 2
(as rank 4 does); k_proj's 512 rows are read as 4 pieces of 128, each by two ranks.

Modules that share kv heads (`AttentionSpec.shares_kv`): transformers attention (its forward reads
`num_key_value_groups`, which is rewritten) and diffusers attention whose processor derives kv heads
from the widths (Lumina2: local k width // head_dim = 1 kv head per rank, n_rep = local q heads).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ...errors import PlanError
from ...policy import is_int
from ..binding.heads import AttentionSpec
from ..binding.linears import LinearSpec
from ..binding.resolved import Resolved


def share_kv(resolved: Resolved, model: nn.Module, tp: int) -> Resolved:
    """`resolved` bound to `tp`: kv projections of attention modules with fewer kv heads than tp shared.

    A no-op (the same object) when no attention module needs it. Mutates nothing.
    """
    shared = [spec for spec in resolved.attention if spec.kv_sharing(tp) > 1]
    if not shared:
        return resolved
    linears = {spec.path: spec for spec in resolved.linears}
    attention = {spec.path: spec for spec in resolved.attention}
    for spec in shared:
        replicas = spec.kv_sharing(tp)
        head_dim = _head_dim(spec, model.get_submodule(spec.path), resolved)
        for linear in _children(resolved.linears, spec.path):
            linears[linear.path] = _bind(linear, spec, head_dim, replicas, tp, resolved.plan.name)
        attention[spec.path] = replace(spec, kv_replicas=replicas)
    return replace(
        resolved,
        linears=tuple(linears[s.path] for s in resolved.linears),
        attention=tuple(attention[s.path] for s in resolved.attention),
    )


def _children(linears, path: str) -> list[LinearSpec]:
    return [s for s in linears if s.path.rpartition(".")[0] == path and not s.style.is_embedding]


def _bind(linear: LinearSpec, spec: AttentionSpec, head_dim: int, replicas: int, tp: int, plan: str) -> LinearSpec:
    """k/v (kv heads wide): shared by `replicas` ranks; q and o (query heads wide): grouped by kv head."""
    heads, kv_heads = spec.counts()
    if len(linear.sizes) > 1:
        raise PlanError(
            f"plan {plan}, key '{linear.rule.key}': '{spec.path}' has {kv_heads} kv heads, fewer than tp={tp}, so "
            f"they are shared by {replicas} ranks each, which dtp does for separate q/k/v projections only, not for "
            f"the fused '{linear.path}'; use a tp that divides {kv_heads}."
        )
    if linear.sizes[0] == kv_heads * head_dim and linear.style.shard_dim == 0:
        return replace(linear, replicas=replicas)
    padded = (linear.padded_sizes or linear.sizes)[0]
    if linear.sizes[0] % kv_heads or (padded // head_dim // kv_heads) % replicas:
        raise PlanError(
            f"plan {plan}, key '{linear.rule.key}': '{linear.path}' ({linear.sizes[0]} wide) cannot be split into "
            f"{kv_heads} groups of query heads, each over {replicas} ranks (kv heads shared at tp={tp}); "
            f"{heads} query heads need pad=True or a tp that divides them."
        )
    return replace(linear, groups=kv_heads)


def _head_dim(spec: AttentionSpec, module: nn.Module, resolved: Resolved) -> int:
    """The module's `head_dim`, else the widest (padded) child over the (padded) query heads."""
    if is_int(getattr(module, "head_dim", None)):
        return module.head_dim
    heads, _ = spec.counts()
    widest = max((s.padded_sizes or s.sizes)[0] for s in _children(resolved.linears, spec.path))
    return widest // heads
