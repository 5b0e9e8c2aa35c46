"""Head bookkeeping: which attention modules' counts and widths become per-rank values, and their constraints.

After q/k/v are split colwise each rank computes `heads / tp` heads, but diffusers' processors read
the head layout from the module: 20 of 25 reshape with `attn.heads`, Qwen-Image computes
`attn.inner_dim // attn.heads`, Flux2's fused single-stream processor splits by the ratio of
`inner_dim` to `mlp_hidden_dim`. So every count and width below is rewritten to its local value
together (`head_dim` is per head and stays). Without QK-norm a missed rewrite is silently wrong.

kv heads (GQA) are part of the bookkeeping even where the module stores no count: Lumina2's
processor derives `kv_heads = to_k width // (q width // heads)`, and contiguous colwise k/v
shards hold whole kv heads, grouped with their q heads, only when tp divides the kv head count.
Lumina2-2B: 24 q / 8 kv heads of 96; `to_k` is 768 wide, which tp = 16 divides (48 per rank),
but 48 is half a head: contiguous shards cannot serve it. Such modules share kv heads instead when
tp is a multiple of the kv heads (`kv_share.py`, the rule transformers attention uses): at tp = 16
each kv head is held whole by 2 ranks (24 q heads still need pad=True there; 4 q / 2 kv at tp = 4 not).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...errors import PlanError
from ...plan import Plan
from ...policy import is_int
from .constraints import Constraint
from .globs import attention_optional, expand
from .linears import LinearSpec
from .text_attention import transformers_attention_counts

# Head counts (must divide by tp) and the widths derived from them, when the module has them.
HEAD_ATTRS = ("heads", "kv_heads", "num_heads", "num_kv_heads", "num_attention_heads", "num_key_value_heads")
WIDTH_ATTRS = ("inner_dim", "inner_kv_dim", "kv_inner_dim", "mlp_hidden_dim")
KV_WIDTH_ATTRS = ("inner_kv_dim", "kv_inner_dim")  # k/v projection width, where the module stores it


HEAD_COUNTS = (
    "heads",
    "num_heads",
    "n_heads",
    "num_attention_heads",
)  # query head counts, as modules (or `checked`) name them
KV_COUNTS = ("kv_heads", "num_kv_heads", "num_key_value_heads")
GROUPS_ATTR = "num_key_value_groups"  # transformers: query heads per kv head, for repeat_kv / enable_gqa


@dataclass(frozen=True)
class AttentionSpec:
    """An attention module and the global values of the attributes that become per-rank."""

    path: str
    key: str  # the `attention` glob (or "<inferred>") that selected it
    values: tuple[tuple[str, int], ...]  # (attribute, global value)
    checked: tuple[tuple[str, int], ...] = ()  # counts tp must divide that are not rewritten (read from a config)
    kv_heads: int | None = None  # derived kv head count when k/v are narrower than q (GQA); not an attribute
    shares_kv: bool = False  # kv heads may be shared by tp / kv ranks (transformers attention, kv_share.py)
    kv_replicas: int = 1  # ranks sharing each kv head at the bound TP degree (set by kv_share.share_kv)

    def constraints(self) -> list[Constraint]:
        found = [
            Constraint(value, f"{attr} of {self.path}", self.key, shareable=self.shares_kv and attr in KV_COUNTS)
            for attr, value in self.values + self.checked
            if attr != GROUPS_ATTR
        ]
        if self.kv_heads is not None:
            found.append(
                Constraint(
                    self.kv_heads, f"kv heads (k width / head_dim) of {self.path}", self.key, shareable=self.shares_kv
                )
            )
        return found

    def counts(self) -> tuple[int | None, int | None]:
        """(query heads, kv heads) as far as known: kept attributes, config counts, derived kv heads."""
        known = dict(self.checked + self.values)
        heads = next((known[a] for a in HEAD_COUNTS if a in known), None)
        kv_heads = next((known[a] for a in KV_COUNTS if a in known), self.kv_heads)
        return heads, kv_heads if kv_heads is not None else heads

    def kv_sharing(self, tp: int) -> int:
        """Ranks that share each kv head at `tp`: tp / kv when this module may share (`shares_kv`) and its kv
        heads are fewer than tp and divide it (kv_share.py), else 1."""
        _, kv_heads = self.counts()
        if not self.shares_kv or kv_heads is None or kv_heads >= tp or tp % kv_heads:
            return 1
        return tp // kv_heads

    def local_values(self, tp: int) -> dict[str, int]:
        """Per-rank values: counts and widths / tp; kv counts * replicas / tp; groups = local q / local kv."""
        local = {
            attr: value * self.kv_replicas // tp if attr in KV_COUNTS + KV_WIDTH_ATTRS else value // tp
            for attr, value in self.values
            if attr != GROUPS_ATTR
        }
        if GROUPS_ATTR in dict(self.values):
            heads, kv_heads = self.counts()
            local[GROUPS_ATTR] = (heads // tp) // (kv_heads * self.kv_replicas // tp)
        return local


def query_heads(module: nn.Module) -> int | None:
    """The query head count of a diffusers attention module: its integer `heads`, or `num_heads` on a module with
    a processor (Krea2Attention names it so, beside `num_kv_heads`; Cosmos3PackedMoTAttention `num_attention_heads`,
    beside `num_key_value_heads`); None otherwise."""
    if is_int(getattr(module, "heads", None)):
        return module.heads
    if getattr(module, "processor", None) is None:
        return None
    return next(
        (getattr(module, a) for a in ("num_heads", "num_attention_heads") if is_int(getattr(module, a, None))), None
    )


def attention_spec(path: str, module: nn.Module, key: str) -> AttentionSpec | None:
    """The spec for `module`, or None when it has no query head count (`query_heads`) and is no transformers
    attention module."""
    if query_heads(module) is None:
        counts = transformers_attention_counts(module)
        if counts is not None:
            return AttentionSpec(path, key, *counts, shares_kv=True)
        return None
    values = tuple(
        (attr, getattr(module, attr)) for attr in HEAD_ATTRS + WIDTH_ATTRS if is_int(getattr(module, attr, None))
    )
    values += _head_wide_out_dim(module)
    # A processor that derives its kv heads from the widths only (Lumina2: `to_k` width // head_dim, no kv
    # count attribute) reads the shared layout right too: each rank's k/v hold whole kv heads (kv_share.py,
    # the rule transformers attention uses). Modules with a kv count attribute keep the stricter rule.
    kv_heads = derived_kv_heads(module)
    shares = kv_heads is not None and not any(is_int(getattr(module, a, None)) for a in KV_COUNTS)
    return AttentionSpec(path=path, key=key, values=values, kv_heads=kv_heads, shares_kv=shares)


def _head_wide_out_dim(module: nn.Module) -> tuple[tuple[str, int], ...]:
    """`out_dim` as a width to rewrite, when it equals the q width (heads x head_dim). diffusers' `Attention` keeps
    the output projection's width there, and in 0.42.1 only two processors read it after `__init__`, both as the
    attention output's width: OmniGen reshapes the heads' output to `attn.out_dim` before `to_out`, Cosmos 2.5's image
    branch takes `attn.out_dim // attn.heads` as the head width. Per rank that width is the local heads' (OmniGen
    4 heads of 16 at tp=2: out_dim 64 -> 32). An `out_dim` that differs from the q width is left alone."""
    out_dim = getattr(module, "out_dim", None)
    q_width = _width(module, ("inner_dim",), "to_q")
    return (("out_dim", out_dim),) if is_int(out_dim) and out_dim == q_width else ()


def derived_kv_heads(module: nn.Module) -> int | None:
    """kv heads from widths when k/v are narrower than q: `k width // (q width // heads)`, else None.

    The q width is `inner_dim` or `to_q`'s outputs; the k width `inner_kv_dim` / `kv_inner_dim` or
    `to_k`'s outputs. Example: Lumina2 tiny (4 q heads of 16, to_k 32 wide): 32 // (64 // 4) = 2.
    """
    q_width = _width(module, ("inner_dim",), "to_q")
    k_width = _width(module, KV_WIDTH_ATTRS, "to_k")
    heads = query_heads(module)
    if not is_int(heads) or q_width is None or k_width is None or k_width == q_width or q_width % heads:
        return None
    return k_width // (q_width // heads)


def _width(module: nn.Module, attrs: tuple[str, ...], linear_name: str) -> int | None:
    linear = getattr(module, linear_name, None)
    if isinstance(linear, nn.Linear):
        return linear.out_features
    return next((getattr(module, a) for a in attrs if is_int(getattr(module, a, None))), None)


def resolve_attention(plan: Plan, model: nn.Module, linears: list[LinearSpec]) -> list[AttentionSpec]:
    """The attention modules whose head bookkeeping must follow the sharded projections."""
    owners = _attention_owners(model, linears)
    if plan.attention is None:
        return [attention_spec(path, model.get_submodule(path), "<inferred>") for path in owners]
    listed: dict[str, AttentionSpec] = {}
    for key in plan.attention:
        for path, module in expand(model, key, plan.name, optional=attention_optional(plan, key)):
            spec = attention_spec(path, module, key)
            if spec is None:
                raise PlanError(
                    f"plan {plan.name}, attention '{key}': '{path}' ({type(module).__name__}) has no integer "
                    f"`heads` (or `num_heads` beside a processor) attribute; list attention modules only."
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


def width_constraints(linears, attention: list[AttentionSpec]) -> list[Constraint]:
    """The Linears' width constraints, less those of q/k/v/o under attention modules that may share kv heads.

    Their widths are heads x head_dim, so the head constraints cover them, and a shared kv
    projection is split into tp / replicas parts, not tp: Llama's 2 kv heads of 8 (k_proj 16 wide)
    at tp=4 hold 8 rows per rank pair, although 16 / 4 would also pass; at tp=6 16 / 6 would not.
    """
    sharing = {spec.path for spec in attention if spec.shares_kv}
    return [c for spec in linears if spec.path.rpartition(".")[0] not in sharing for c in spec.constraints()]
