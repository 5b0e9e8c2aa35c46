"""Exact zero-padding (`pad=True`): any TP degree, by padding heads and widths that tp does not divide.

A head whose q/k/v rows and output-projection columns are zero contributes exactly nothing: its
q = k = v = 0, so per-head QK-norm gives 0 (`0 * rsqrt(0 + eps)`), RoPE rotates 0 to 0, softmax over
q.k = 0 is uniform (finite, masked or not) and averages v = 0 into 0, and the zero output-projection
columns would drop it anyway. A zero FFN unit (zero up/gate row, zero down column) contributes
`0 * act(0)` = 0. So padding changes no output; it costs the padded weights and compute.

The rules, for one TP degree `tp` (`m` = tp, or tp * cp under Ulysses, whose heads per rank must
also divide by cp):

    heads      H  -> H' = ceil(H / m) * m                  (zero heads appended at the end)
    GQA        kv -> kv' = ceil(kv / m) * m, H' = kv' * (H / kv)
               (q head i reads kv head i // (H / kv); appending keeps that map on every rank)
    shared kv  transformers attention with kv < m, m % kv == 0 (kv heads shared by R = m / kv ranks,
               kv_share.py): kv stays, each group of H / kv query heads pads to a multiple of R on
               its own: H' = kv * ceil(H / kv / R) * R (Qwen2.5-VL-7B at tp = 8: 28 = 4 x 7 -> 4 x 8)
    widths     a colwise block under an attention module of width H * d -> H' * d, kv * d -> kv' * d;
               any other colwise width B -> ceil(B / tp) * tp (FFN units, gathered outputs);
               a rowwise block takes the padded width of the colwise block of the same width that
               feeds it (the pair rule's nearest scope), so producer and consumer agree.

Worked example (Z-Image 6B, 30 heads of 128, tp = 8): H' = 32, to_q/to_k/to_v [3840 -> 4096 rows],
to_out.0 [4096 columns]; rank 7 holds heads 28, 29 and two zero heads; FFN 10240 divides, unpadded.
The slicing itself (real rows read, zero rows made) is `Layout.padded_sizes` (`layout.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from ...errors import PlanError
from ...policy import check_degree, is_int
from ..binding.constraints import check_divides
from ..binding.cp import CpResolved
from ..binding.heads import GROUPS_ATTR, HEAD_COUNTS, KV_COUNTS, AttentionSpec, width_constraints
from ..binding.linears import LinearSpec
from ..binding.norms import NormSpec
from ..binding.pairs import nearest_scope
from ..binding.resolved import Resolved


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class HeadPadding:
    """One attention module's head counts before and after padding (see the module docstring)."""

    path: str
    heads: int
    kv_heads: int
    head_dim: int
    padded_heads: int
    padded_kv_heads: int

    def pad_width(self, width: int, tp: int) -> int:
        """The padded size of a width under this module: heads x head_dim follow the heads, the rest round up."""
        if width == self.heads * self.head_dim:
            return self.padded_heads * self.head_dim
        if width == self.kv_heads * self.head_dim:
            return self.padded_kv_heads * self.head_dim
        return round_up(width, tp)


@dataclass(frozen=True)
class Padding:
    """A plan padded for one TP degree: `resolved` is what `apply` shards, `unpadded` what `resolve` found."""

    tp: int
    unpadded: Resolved
    resolved: Resolved
    heads: tuple[HeadPadding, ...]

    @property
    def is_noop(self) -> bool:
        """tp divides everything already: the padded plan is the plan."""
        return all(h.padded_heads == h.heads and h.padded_kv_heads == h.kv_heads for h in self.heads) and all(
            s.padded_sizes == s.sizes for s in self.resolved.linears
        )

    def padded_heads(self) -> dict[str, int]:
        return {h.path: h.padded_heads for h in self.heads}


def head_padding(
    spec: AttentionSpec, module: nn.Module, multiple: int, plan_name: str, widths: tuple[int, ...] = ()
) -> HeadPadding:
    """Pad `spec`'s heads (and kv heads) to multiples of `multiple`; PlanError when the head layout is unknown.

    The head width is the module's `head_dim`, else `inner_dim / heads`, else (a bare module whose
    processor reshapes with `heads` only) the widest of `widths` (its colwise children's blocks:
    q is the widest of q/k/v) that the heads divide, over the heads.
    """
    values = dict(spec.values)
    heads, kv_heads = spec.counts()
    if heads is None:
        raise PlanError(
            f"plan {plan_name}: pad=True needs the head count of '{spec.path}' ({type(module).__name__}), which "
            f"keeps none; use a tp that divides its heads."
        )
    head_dim = getattr(module, "head_dim", None)
    if not is_int(head_dim):
        head_dim = values["inner_dim"] // heads if "inner_dim" in values else None
    if not head_dim:
        head_dim = max((w for w in widths if w % heads == 0), default=0) // heads
    if not head_dim:
        raise PlanError(
            f"plan {plan_name}: pad=True needs the head width of '{spec.path}', but it has neither `head_dim` nor "
            f"`inner_dim`; use a tp that divides its {heads} heads."
        )
    if spec.kv_heads is None and kv_heads == heads and "inner_kv_dim" in values:
        kv_heads = values["inner_kv_dim"] // head_dim
    if kv_heads == heads:
        padded = round_up(heads, multiple)
        return HeadPadding(spec.path, heads, kv_heads, head_dim, padded, padded)
    if heads % kv_heads:
        raise PlanError(
            f"plan {plan_name}: pad=True cannot pad '{spec.path}': {heads} query heads are not a multiple of "
            f"{kv_heads} kv heads (GQA groups must be whole); use a tp that divides both."
        )
    group, sharing = heads // kv_heads, spec.kv_sharing(multiple)
    if sharing > 1:  # kv heads shared by `sharing` ranks (kv_share.py): each group pads to a multiple of it alone
        return HeadPadding(spec.path, heads, kv_heads, head_dim, kv_heads * round_up(group, sharing), kv_heads)
    padded_kv = round_up(kv_heads, multiple)
    return HeadPadding(spec.path, heads, kv_heads, head_dim, padded_kv * group, padded_kv)


def pad_resolved(resolved: Resolved, model: nn.Module, tp: int, head_multiple: int | None = None) -> Padding:
    """`resolved` with every head count and width zero-padded so that `tp` divides it. Mutates nothing.

    head_multiple: what padded head counts are multiples of (default tp; tp * cp for Ulysses).
    """
    check_degree(tp, f"plan {resolved.plan.name}: tp")
    multiple = head_multiple or tp
    name = resolved.plan.name
    heads = {
        s.path: head_padding(s, model.get_submodule(s.path), multiple, name, _child_widths(resolved, s.path))
        for s in resolved.attention
    }
    col = [_pad_colwise(spec, heads, tp) for spec in resolved.linears if spec.style.shard_dim == 0]
    pairs = [s for s in col if not s.style.gathers_output]
    padded = {s.path: s for s in col}
    for spec in resolved.linears:
        if spec.style.shard_dim == 1:
            padded[spec.path] = _pad_rowwise(spec, pairs, tp, name)
        elif spec.style.shard_dim not in (0, 1):  # experts: hidden units are not padded (no head count to round)
            padded[spec.path] = _unpadded_experts(spec, tp, name)
    linears = tuple(padded[spec.path] for spec in resolved.linears)
    attention = tuple(_pad_attention(spec, heads[spec.path], tp) for spec in resolved.attention)
    _check_outputs_unpadded(resolved, heads.values())
    norms = tuple(_pad_norm(spec, heads, tp) for spec in resolved.norms)
    constraints = width_constraints([replace(s, sizes=s.padded_sizes) for s in linears], list(attention))
    constraints += [c for spec in (*attention, *norms) for c in spec.constraints()]
    out = replace(resolved, linears=linears, attention=attention, norms=norms, constraints=tuple(constraints))
    assert all(c.allows(tp) for c in out.constraints), "padding left a width tp does not divide"
    return Padding(tp, resolved, out, tuple(heads.values()))


def _unpadded_experts(spec: LinearSpec, tp: int, plan_name: str) -> LinearSpec:
    if spec.sizes[0] % tp:
        raise PlanError(
            f"plan {plan_name}, key '{spec.rule.key}': tp={tp} does not divide the {spec.sizes[0]} hidden units of "
            f"every expert in '{spec.path}', and pad=True does not pad experts; use a tp that divides it."
        )
    return replace(spec, padded_sizes=spec.sizes)


def _check_outputs_unpadded(resolved: Resolved, heads) -> None:
    """`shard_output` tables (RoPE over the full inner dim, per-head RoPE) are cut, not padded (yet)."""
    padded = [h.path for h in heads if h.padded_heads != h.heads]
    if resolved.outputs and padded:
        spec = resolved.outputs[0]
        raise PlanError(
            f"plan {resolved.plan.name}, key '{spec.rule.key}': pad=True would pad the heads of '{padded[0]}', but "
            f"the shard_output tables of '{spec.path}' are not padded with them (yet); use a tp that divides the heads."
        )


def _pad_norm(spec: NormSpec, heads: dict[str, HeadPadding], tp: int) -> NormSpec:
    """A norm across heads pads like the q/k projection it follows: its owner's padded width.

    Exact: the padded features are zero (zero q/k rows) with zero weight, so they add nothing to the
    all-reduced sum of squares, and `ShardedRMSNorm` divides that sum by the true width D, not D'.
    """
    owner = heads.get(spec.path.rpartition(".")[0])
    return replace(spec, padded_width=owner.pad_width(spec.width, tp) if owner else round_up(spec.width, tp))


def _child_widths(resolved: Resolved, path: str) -> tuple[int, ...]:
    """The blocks of the colwise Linears directly under `path` (q/k/v of an attention module)."""
    children = [s for s in resolved.linears if s.style.shard_dim == 0 and s.path.rpartition(".")[0] == path]
    return tuple(b for s in children for b in s.sizes)


def _pad_colwise(spec: LinearSpec, heads: dict[str, HeadPadding], tp: int) -> LinearSpec:
    owner = heads.get(spec.path.rpartition(".")[0])
    sizes = tuple(owner.pad_width(b, tp) if owner else round_up(b, tp) for b in spec.sizes)
    return replace(spec, padded_sizes=sizes)


def _pad_rowwise(spec: LinearSpec, colwise: list[LinearSpec], tp: int, plan_name: str) -> LinearSpec:
    """Each input block takes the padded width of the colwise blocks of its width in the nearest scope."""
    _, partners = nearest_scope(spec.path, colwise)
    sizes = []
    for size in spec.sizes:
        options = {p for s in partners for b, p in zip(s.sizes, s.padded_sizes) if b == size}
        if len(options) > 1:
            raise PlanError(
                f"plan {plan_name}, key '{spec.rule.key}': pad=True cannot tell how to pad input width {size} of "
                f"'{spec.path}': colwise layers of that width pad it to {sorted(options)}; use a tp that divides it."
            )
        sizes.append(options.pop() if options else round_up(size, tp))
    return replace(spec, padded_sizes=tuple(sizes))


def _pad_attention(spec: AttentionSpec, padding: HeadPadding, tp: int) -> AttentionSpec:
    """The spec as if the module had the padded heads: `local_values(tp)` are then the per-rank padded values."""

    def padded(attr: str, value: int) -> int:
        if attr in HEAD_COUNTS:
            return padding.padded_heads
        if attr in KV_COUNTS:
            return padding.padded_kv_heads
        return value if attr == GROUPS_ATTR else padding.pad_width(value, tp)  # groups: recomputed per rank

    kv_heads = padding.padded_kv_heads if spec.kv_heads is not None else None
    return replace(
        spec,
        values=tuple((a, padded(a, v)) for a, v in spec.values),
        checked=tuple((a, padded(a, v)) for a, v in spec.checked),
        kv_heads=kv_heads,
    )


# ---------------------------------------------------------------------------------------------
# degrees


def pad_bound(resolved: Resolved) -> int:
    """The largest degree `pad=True` offers: the smallest head count the plan touches (else the smallest width)."""
    # kv heads bound it too, unless they may be shared (then tp may exceed them)
    counts = [n for s in resolved.attention for n in s.counts()[: 1 if s.shares_kv else 2] if n is not None]
    return min(counts or [c.value for c in resolved.constraints] or [1])


def pad_candidates(
    resolved: Resolved, model: nn.Module, head_factor: int = 1, allows=lambda tp, padding: True
) -> list[int]:
    """Every degree from 1 to `pad_bound` that padding serves and `allows(tp, padding)` accepts (cp checks).

    head_factor: heads are padded to multiples of tp * head_factor (cp under Ulysses).
    """
    found = []
    for tp in range(1, pad_bound(resolved) + 1):
        try:
            padding = pad_resolved(resolved, model, tp, tp * head_factor)
        except PlanError:
            continue
        if allows(tp, padding):
            found.append(tp)
    return found


def pad_cp(cp_resolved: CpResolved, padding: Padding) -> CpResolved:
    """The cp binding with the padded head counts of the TP-sharded attention modules (what Ulysses splits)."""
    padded = padding.padded_heads()
    attention = tuple(
        replace(spec, heads=padded[spec.path]) if spec.tp_sharded and spec.path in padded else spec
        for spec in cp_resolved.attention
    )
    return replace(cp_resolved, attention=attention)


def check_unpadded(resolved: Resolved, model: nn.Module, tp: int, padded_candidates=None) -> None:
    """`check_divides` for pad=False; a refusal suggests pad=True with the degrees it would allow."""
    check_degree(tp, f"plan {resolved.plan.name}: tp")
    hint = ""
    if not all(c.allows(tp) for c in resolved.constraints):
        try:
            options = padded_candidates() if padded_candidates else pad_candidates(resolved, model)
        except PlanError:  # e.g. a cp problem: reported by its own check, after this one
            options = []
        if tp in options or _pads(resolved, model, tp):
            listed = f"; with pad=True, supported tp: {', '.join(map(str, options))}" if tp in options else ""
            hint = (
                f" Or pass pad=True (`dtp check --pad`): heads and widths are zero-padded to multiples of tp, "
                f"which is exact and costs only the padded compute{listed}."
            )
    check_divides(resolved.constraints, tp, resolved.plan.name, hint=hint)


def _pads(resolved: Resolved, model: nn.Module, tp: int) -> bool:
    """Padding serves `tp` although `pad_candidates` stops at the smallest head count (a vision tower of 2
    heads at tp=4: 2 zero heads)."""
    try:
        pad_resolved(resolved, model, tp, tp)
    except PlanError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# cost


def overhead(padding: Padding, model: nn.Module) -> dict:
    """What padding costs, read from the unsharded `model`'s shapes (call before `apply`).

    padded_params / padded_bytes: zero elements added to the sharded parameters, all ranks together
        (each rank holds 1/tp of them);
    linear_flops_ratio: padded / unpadded multiply-adds per token of every Linear in the model
        (a Linear costs in * out per token; unplanned ones are unchanged);
    attention_flops_ratio: padded / unpadded heads x head_dim summed over the padded attention
        modules (attention costs seq^2 x heads x head_dim, whatever the sequence length).
    """
    added = added_bytes = 0
    for spec in padding.resolved.linears:
        linear = model.get_submodule(spec.path)
        for name, layout in spec.param_layouts().items():
            if layout is None:
                continue
            param = getattr(linear, name)
            count = (sum(layout.split_sizes) - sum(layout.block_sizes)) * (param.numel() // param.shape[layout.dim])
            added += count
            added_bytes += count * param.element_size()
    weights = {spec.path: spec for spec in padding.resolved.linears}
    flops = padded_flops = 0
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            flops += module.weight.numel()
            spec = weights.get(path)
            scale = sum(spec.weight_layout.split_sizes) / sum(spec.sizes) if spec else 1
            padded_flops += module.weight.numel() * scale
    widths = sum(h.heads * h.head_dim for h in padding.heads)
    padded_widths = sum(h.padded_heads * h.head_dim for h in padding.heads)
    return {
        "padded_params": added,
        "padded_bytes": added_bytes,
        "padded_bytes_per_rank": added_bytes // padding.tp,
        "linear_flops_ratio": padded_flops / flops if flops else 1.0,
        "attention_flops_ratio": padded_widths / widths if widths else 1.0,
        "heads": sorted({f"{h.heads}->{h.padded_heads}" for h in padding.heads}),
    }
