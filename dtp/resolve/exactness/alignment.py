"""Head alignment: every rank's q, k, v and o hold whole heads, the same heads, in the same order.

After `apply`, rank r's attention computes `softmax(q_j k_g^T) v_g` for its local query heads j
(g = the local kv head of j's group) and its output projection takes those heads' outputs in that
order. That is the one-device result only if, for every rank, the local rows of q, k and v and the
local input columns of o are the features of the heads that rank is meant to hold:

    q rows, o columns (first H_l * d)   heads  [r H'/tp, (r + 1) H'/tp)  of q's padded head order
    k rows, v rows                      kv heads [p KV'/P, (p + 1) KV'/P), p = r // R, P = tp / R

(H', KV': padded counts; R: ranks sharing a kv head, `kv_share.py`; groups pad on their own). The
expected pieces are the `Layout` of one plain colwise projection of q's (kv's) width with the bound
padding, groups and replicas; the actual ones are the planned `Layout` of each projection. Both are
read with `Layout.local_slice` on `arange(1, width + 1)` (0 marks a zero-padded row), so this is the
slicing the styles and the loader use, not a re-derivation. A projection the plan leaves whole (or
gathers, or shards rowwise, whose output is all-reduced whole) holds every feature: at tp > 1 that is
never the expected piece of a module whose head counts are rewritten.

Example (the silent one): Qwen-Image tiny, 4 heads of 16, tp = 2, `to_q: {style: packed_colwise,
blocks: [1, 3]}`: rank 0's q rows are features 0:8 and 16:40, i.e. half of head 0 and heads 1-2 cut
in the middle, while its k rows are heads 0-1: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ...errors import PlanError
from ...policy import is_int
from ..binding.heads import AttentionSpec, attention_spec
from ..binding.linears import LinearSpec
from ..binding.resolved import Resolved
from ..layout import Layout

# Direct children of an attention module, by role. Joint attention's two streams share the roles:
# text and image heads are concatenated along the sequence, so they must be the same heads.
# (HiDream's text stream: `to_q_t`, ..., `to_out_t`.)
Q_NAMES = ("to_q", "add_q_proj", "to_q_t", "q_proj", "q")
K_NAMES = ("to_k", "add_k_proj", "to_k_t", "k_proj", "k")
V_NAMES = ("to_v", "add_v_proj", "to_v_t", "v_proj", "v")
O_NAMES = ("to_out.0", "to_out", "to_add_out", "to_out_t", "o_proj", "out_proj", "o", "proj")
FUSED_NAMES = ("to_qkv", "to_added_qkv", "qkv", "to_qkv_mlp_proj")  # [q | k | v (| more)] along the output


@dataclass(frozen=True)
class Heads:
    """One attention module's head geometry at one TP degree (real and padded counts, head width)."""

    heads: int
    kv_heads: int
    head_dim: int
    padded_heads: int
    padded_kv_heads: int
    groups: int  # query-head groups padded on their own (shared kv heads), else 1
    replicas: int  # ranks sharing one kv head, else 1

    def q_layout(self) -> Layout:
        return _layout(self.heads * self.head_dim, self.padded_heads * self.head_dim, groups=self.groups)

    def kv_layout(self) -> Layout:
        return _layout(self.kv_heads * self.head_dim, self.padded_kv_heads * self.head_dim, replicas=self.replicas)


def _layout(width: int, padded: int, groups: int = 1, replicas: int = 1) -> Layout:
    return Layout(0, (width,), (padded,) if padded != width else None, groups, replicas)


def check_alignment(resolved: Resolved, model: nn.Module, tp: int) -> None:
    """PlanError naming the key and the rank when some rank's q/k/v/o pieces are not its heads (see above).

    `resolved` is bound to `tp` (padded, kv shared). Mutates nothing. A no-op at tp = 1.
    """
    if tp == 1:
        return
    specs = {spec.path: spec for spec in resolved.linears if not spec.style.is_embedding}
    seen = set()  # repeated blocks: one module of each kind is checked (FLUX.2-dev: 2 of 56)
    for attention in resolved.attention:
        module = model.get_submodule(attention.path)
        heads = _heads(attention, module)
        kind = (heads, _children_kind(module, attention.path, specs))
        if heads is None or kind in seen:
            continue
        seen.add(kind)
        for rank in range(tp):
            _check_rank(resolved.plan.name, attention, module, specs, heads, tp, rank)


def _children_kind(module: nn.Module, path: str, specs: dict[str, LinearSpec]) -> tuple:
    """What the check reads of a module's children: names, widths and planned layouts."""
    found = []
    for name in (*Q_NAMES, *K_NAMES, *V_NAMES, *O_NAMES, *FUSED_NAMES):
        linear = _child(module, name)
        if linear is not None:
            spec = specs.get(f"{path}.{name}")
            layout = (spec.style, spec.weight_layout) if spec is not None else None
            found.append((name, linear.in_features, linear.out_features, layout))
    return tuple(found)


def _heads(attention: AttentionSpec, module: nn.Module) -> Heads | None:
    """The geometry of `attention`, or None when it has no recognizable q projection (nothing to compare)."""
    real = attention_spec(attention.path, module, attention.key)
    heads, kv_heads = real.counts() if real is not None else (None, None)
    q_width = _q_width(module, heads)
    if heads is None or q_width is None or q_width % heads:
        return None
    padded_heads, padded_kv = attention.counts()
    replicas = attention.kv_replicas
    return Heads(heads, kv_heads, q_width // heads, padded_heads, padded_kv, kv_heads if replicas > 1 else 1, replicas)


def _q_width(module: nn.Module, heads: int | None) -> int | None:
    """q's width: the q projection's outputs, else the module's `inner_dim` or heads x `head_dim` (fused q/k/v)."""
    for name in Q_NAMES:
        linear = _child(module, name)
        if linear is not None:
            return linear.out_features
    if not any(_child(module, name) is not None for name in FUSED_NAMES):
        return None
    if is_int(getattr(module, "inner_dim", None)):
        return module.inner_dim
    head_dim = getattr(module, "head_dim", None)
    return heads * head_dim if heads and is_int(head_dim) else None


def _child(module: nn.Module, name: str) -> nn.Linear | None:
    try:
        found = module.get_submodule(name)
    except AttributeError:
        return None
    return found if isinstance(found, nn.Linear) else None


def _check_rank(plan, attention, module, specs, heads: Heads, tp: int, rank: int) -> None:
    q_expected = heads.q_layout().local_slice(torch.arange(1, heads.heads * heads.head_dim + 1), tp, rank)
    kv_expected = heads.kv_layout().local_slice(torch.arange(1, heads.kv_heads * heads.head_dim + 1), tp, rank)
    for name, role, got in _pieces(module, attention.path, specs, heads, tp, rank):
        expected = q_expected if role in ("q", "o") else kv_expected
        if not torch.equal(got, expected):
            _refuse(plan, attention, name, role, specs, heads, rank, got, expected)


def _pieces(module, path, specs, heads: Heads, tp: int, rank: int):
    """(child name, role, this rank's feature indices) of every recognized q/k/v/o child (1-based; 0 = zero)."""
    q_width, kv_width = heads.heads * heads.head_dim, heads.kv_heads * heads.head_dim
    for names, role in ((Q_NAMES, "q"), (K_NAMES, "k"), (V_NAMES, "v")):
        for name in names:
            linear = _child(module, name)
            if linear is not None:
                yield name, role, _output_piece(specs.get(f"{path}.{name}"), linear.out_features, tp, rank)
    for name in FUSED_NAMES:
        linear = _child(module, name)
        if linear is None:
            continue
        got = _output_piece(specs.get(f"{path}.{name}"), linear.out_features, tp, rank)
        local_q = heads.padded_heads * heads.head_dim // tp
        local_kv = heads.padded_kv_heads * heads.head_dim * heads.replicas // tp
        start = 0
        for role, size, offset in (("q", local_q, 0), ("k", local_kv, q_width), ("v", local_kv, q_width + kv_width)):
            piece = got[start : start + size]
            yield name, role, torch.where(piece > 0, piece - offset, piece)
            start += size
    for name in O_NAMES:
        linear = _child(module, name)
        if linear is not None and linear.in_features >= q_width:
            got = _input_piece(specs.get(f"{path}.{name}"), linear.in_features, tp, rank)
            yield name, "o", got[: heads.padded_heads * heads.head_dim // tp]


def _output_piece(spec: LinearSpec | None, width: int, tp: int, rank: int) -> torch.Tensor:
    """The output features rank `rank` computes: its colwise rows, or all of them (whole, gathered, rowwise)."""
    index = torch.arange(1, width + 1)
    if spec is None or spec.style.shard_dim != 0 or spec.style.gathers_output:
        return index
    return spec.weight_layout.local_slice(index, tp, rank)


def _input_piece(spec: LinearSpec | None, width: int, tp: int, rank: int) -> torch.Tensor:
    """The input features rank `rank` multiplies: its rowwise columns, or all of them."""
    index = torch.arange(1, width + 1)
    if spec is None or spec.style.shard_dim != 1:
        return index
    return replace(spec.weight_layout, dim=0).local_slice(index, tp, rank)


def _refuse(plan, attention, name, role, specs, heads: Heads, rank, got, expected) -> None:
    path = f"{attention.path}.{name}"
    spec = specs.get(path)
    key = spec.rule.key if spec is not None else _suggested_key(attention, name)
    how = f"'{spec.style.value}'" if spec is not None else "not in the plan (whole on every rank)"
    verb = "input columns" if role == "o" else "rows"
    raise PlanError(
        f"plan {plan}, key '{key}': '{path}' ({role} of attention '{attention.path}', {how}) does not give rank "
        f"{rank} its heads: its {verb} there are {_describe(got, heads.head_dim)}, but the module's other "
        f"projections and its per-rank head count ({heads.padded_heads} heads / tp) need "
        f"{_describe(expected, heads.head_dim)}. Every rank must hold whole heads, the same ones in q, k, v "
        f"(colwise, alike) and o (rowwise); packed blocks only on fused q/k/v, matching their widths."
    )


def _suggested_key(attention: AttentionSpec, name: str) -> str:
    """The key a missing projection would have: the attention glob (or path) and the child's name."""
    base = attention.key if attention.key != "<inferred>" else attention.path
    return f"{base}.{name}"


def _describe(index: torch.Tensor, head_dim: int) -> str:
    """'heads [0, 1]' for whole heads (a zero-padded head as 'zero'), else the feature ranges."""
    rows = index.tolist()
    if len(rows) % head_dim == 0:
        found = []
        for i in range(0, len(rows), head_dim):
            head = rows[i : i + head_dim]
            if all(v == 0 for v in head):
                found.append("zero")
            elif head[0] % head_dim == 1 and head == list(range(head[0], head[0] + head_dim)):
                found.append(str(head[0] // head_dim))
            else:
                return f"{len(rows)} features {_ranges(rows)}"
        return f"heads [{', '.join(found)}]"
    return f"{len(rows)} features {_ranges(rows)}"


def _ranges(rows: list[int]) -> str:
    """0-based [start:stop) runs of 1-based indices, zero rows as 'zero': [1, 2, 3, 9, 0] -> '0:3, 8:9, zero'."""
    runs: list[list[int]] = []
    for v in rows:
        if runs and v and runs[-1][-1] and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        elif runs and not v and not runs[-1][-1]:
            continue
        else:
            runs.append([v])
    text = [f"{run[0] - 1}:{run[-1]}" if run[0] else "zero" for run in runs]
    return ", ".join(text[:6]) + (", ..." if len(text) > 6 else "")
