"""`dtp.suggest_plan` / `dtp suggest`: a plan proposed from one traced forward, never a wrong one.

One unsharded forward on example inputs, with every Linear's output tagged by its path (the same
tags as the lint, `lint.TagMode`), tells which Linears consume which Linears' outputs, where those
outputs are cut (`chunk`/`split`/`x[..., a:b]`), concatenated (`cat(dim=-1)`) and viewed as heads,
and where they go that a sharded activation must not go. From that:

- pairs: Linears joined by "output reaches input" form components; a component whose producers
  (outputs consumed) and consumers (inputs produced) are disjoint, and whose producers' outputs
  reach nothing but the consumers, becomes colwise -> rowwise. A producer's cuts become its packed
  blocks: FLUX.2's single-stream `to_qkv_mlp_proj` is split at [192 | 384], then `chunk(3)` and
  `x[..., :192]` cut it at 64, 128 and 384, so it is `packed_colwise` [64, 64, 64, 192, 192]
  (written as proportions [1, 1, 1, 3, 3]); a consumer's input blocks follow the pieces it gets
  (`cat([attn 64, mlp 192])` -> `packed_rowwise` [1, 3]).
- heads: attention modules owning sharded projections get head bookkeeping (`attention` inferred);
  a reshape of a sharded output must be heads x head_dim of the attention module running it.
- gathered: a Linear left out of every pair but applied to few rows (AdaLN modulation, embedders:
  [batch, k * dim]) is `colwise_gathered`, which is exact whatever consumes it.
- unsure -> replicated, with the reason as a YAML comment: an output that reaches the model output,
  the residual stream, a norm over its features, a replicated tensor of the same width, a Linear
  that both consumes and produces, an unrecognized reshape, or a TP degree that does not divide.
  Nothing left -> PlanError.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import reduce

import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils._pytree import tree_leaves

from ..errors import PlanError
from ..families import example_inputs as known_inputs
from ..plan import Plan
from ..policy import check_degree
from ..resolve import resolve
from ..resolve.binding.heads import attention_spec
from ..resolve.binding.held_sizes import check_held_sizes
from .tracing import (
    SPLITS,
    feature_slice_start,
    head_dim_of,
    is_norm,
    on_last_dim,
    set_tag,
    tag_of,
    traced_forward,
    union,
)

# Functions that mix the features of their input: exact on a sharded activation only inside a planned Linear.
MIXING = {F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.einsum, F.conv1d, F.conv2d}
MIXING_NAMES = {"matmul", "mm", "bmm", "__matmul__", "addmm", "baddbmm", "einsum", "conv1d", "conv2d", "conv3d"}
FEW_ROWS = 8  # "applied to few rows": at least this many times fewer rows than the busiest Linear
CAT_PIECES = "_dtp_suggest_cat"  # on a cat(dim=-1) result: [(width, tag)] of its pieces


@dataclass
class Flow:
    """What the trace saw of one Linear."""

    path: str
    out_features: int
    rows: int = 0  # most input rows of one call (tokens x batch)
    consumers: set = field(default_factory=set)  # Linears whose input carries this one's output
    sources: set = field(default_factory=set)  # Linears whose outputs this one's input carries
    cuts: set = field(default_factory=set)  # feature offsets where its output is cut
    pieces: list | None = None  # its input as [(width, {source: span or None})], one piece unless a cat
    unsafe: list = field(default_factory=list)  # why its output must not stay sharded
    input_unsafe: list = field(default_factory=list)  # why its input cannot be sharded
    norms: set = field(default_factory=set)  # RMSNorms over all its heads that its output passes (across heads)

    def blocks(self) -> list[int]:
        """Its output split at every cut: the packed blocks (one block when never cut)."""
        edges = sorted(self.cuts | {0, self.out_features})
        return [b - a for a, b in zip(edges, edges[1:])]


@dataclass(frozen=True)
class Suggestion:
    """A suggested plan with the reasons for everything left replicated (YAML comments)."""

    plan: Plan
    notes: tuple[str, ...]
    model: str

    def to_yaml(self) -> str:
        lines = [f"# Suggested by `dtp suggest` for {self.model} from one traced forward; check it with `dtp verify`."]
        lines += [f"# {note}" for note in self.notes]
        data = {"models": [self.model], "tp": {r.key: _rule_value(r) for r in self.plan.rules}}
        return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _rule_value(rule):
    return {"style": rule.style.value, "blocks": list(rule.blocks)} if rule.blocks else rule.style.value


# ---------------------------------------------------------------------------------------------
# the trace


class FlowTracer:
    """One forward; every Linear output is tagged with its own path; `TagMode` moves tags through functions."""

    def __init__(self, model: nn.Module, starts: set[str] | None = None):
        self.model = model
        self.starts = starts  # the Linears whose outputs are tagged (None: all)
        self.flows = {p: Flow(p, m.out_features) for p, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.stack: list[tuple[str, nn.Module]] = []
        self.norm_inputs: dict[str, dict] = {}  # across-heads norm -> its input's tag (its output carries it)

    def run(self, inputs: dict) -> dict[str, Flow]:
        for tensor in tree_leaves(traced_forward(self.model, inputs, self)):
            self._unsafe(tag_of(tensor), "its output reaches the model output")
        return {p: f for p, f in self.flows.items() if f.rows}

    def enter(self, path, module, args) -> None:
        self.stack.append((path, module))
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if isinstance(module, nn.Linear) and x is not None:
            self._consume(self.flows[path], x)
        elif x is not None and is_norm(module) and tag_of(x):
            if self._across_heads(path, module, x):
                self.norm_inputs[path] = tag_of(x)
                return
            for source, span in tag_of(x).items():
                if span is not None and x.shape[-1] > (self._head_dim_around(source) or 0):
                    self._unsafe({source: span}, f"its output reaches '{path}', a norm over all its features")

    def _across_heads(self, path: str, module: nn.Module, x: torch.Tensor) -> bool:
        """An RMSNorm of an attention module over the whole output of one of its Linears, heads x head_dim wide
        (Wan's norm_q / norm_k): planned `rmsnorm_across_heads` (sum of squares all-reduced), so the output may
        stay sharded. Recorded on the Linear; its rule joins the plan only with the Linear's pair."""
        owner_path, _, _ = path.rpartition(".")
        owner = self.model.get_submodule(owner_path) if owner_path else None
        head_dim = head_dim_of(self.model, owner_path) if owner is not None else None
        tag = tag_of(x)
        if not ("RMSNorm" in type(module).__name__ and len(tag) == 1 and head_dim):
            return False
        if attention_spec(owner_path, owner, "") is None:
            return False
        (source, span) = next(iter(tag.items()))
        width = self.flows[source].out_features
        whole = span == (0, width) and x.shape[-1] == width and source.startswith(f"{owner_path}.")
        if whole and width % head_dim == 0 and width > head_dim:
            self.flows[source].norms.add(path)
            return True
        return False

    def _consume(self, flow: Flow, x: torch.Tensor) -> None:
        flow.rows = max(flow.rows, x.numel() // max(x.shape[-1], 1))
        pieces = getattr(x, CAT_PIECES, None) or [(x.shape[-1], tag_of(x))]
        flow.pieces = pieces if flow.pieces is None or flow.pieces == pieces else flow.pieces
        if flow.pieces != pieces:
            flow.input_unsafe.append("called twice with differently built inputs")
        for width, tag in pieces:
            if not tag:
                if len(pieces) > 1:
                    flow.input_unsafe.append(f"its input concatenates a replicated piece of {width} features")
                continue
            for source in tag:
                flow.sources.add(source)
                self.flows[source].consumers.add(flow.path)

    def leave(self, path, module, output) -> None:
        self.stack.pop()
        if isinstance(module, nn.Linear) and isinstance(output, torch.Tensor):
            started = self.starts is None or path in self.starts
            set_tag(output, {path: (0, module.out_features)} if started else {})
        elif path in self.norm_inputs and isinstance(output, torch.Tensor):
            set_tag(output, self.norm_inputs.pop(path))

    # -- torch functions ------------------------------------------------------------------------

    def on_function(self, func, args, kwargs, out) -> None:
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        tag = union([tag_of(t) for t in inputs])
        if not tag or isinstance(self._top(), nn.Linear):  # a Linear's own F.linear: its hooks handle it
            return
        if self.stack and self.stack[-1][0] in self.norm_inputs:  # inside an across-heads norm: its hooks handle it
            return
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = getattr(func, "__name__", "")
        if name in SPLITS and len(outputs) > 1 and on_last_dim(args, kwargs, 2):
            offsets = [sum(t.shape[-1] for t in outputs[:i]) for i in range(len(outputs))]
            return self._cut(tag, list(zip(outputs, offsets)))
        start = feature_slice_start(func, args)
        if start is not None and isinstance(out, torch.Tensor):
            return self._cut(tag, [(out, start)])
        if func is torch.cat and on_last_dim((args[0][0], *args[1:]), kwargs, 1):
            for t in outputs:
                set_tag(t, {s: None for s in tag})
                setattr(t, CAT_PIECES, [(int(p.shape[-1]), tag_of(p)) for p in args[0]])
            return
        if func is F.scaled_dot_product_attention:
            named = [kwargs.get(k) for k in ("query", "key", "value")[len(args[:3]) :]]
            self._attention(tag, [*args[:3], *named])
        elif (func in MIXING or name in MIXING_NAMES) and any(span is not None for span in tag.values()):
            self._unsafe(tag, f"its features are mixed by '{name}' outside a Linear")
        self._check_width(tag, inputs, outputs, name)

    def _check_width(self, tag, inputs, outputs, name) -> None:
        """Keep spans where the features stay; a replicated operand of the same width or a reshape that is
        not heads x head_dim makes the sources unsafe."""
        known = [t for t in inputs if any(s is not None for s in tag_of(t).values())]
        if known:
            width = known[0].shape[-1]
            if any(not tag_of(t) and t.dim() and t.shape[-1] == width > 1 for t in inputs):
                self._unsafe(tag, f"its output meets a replicated tensor of the same width in '{name}'")
            for t in outputs:
                if t.dim() == 0 or t.shape[-1] != width and not self._is_head_view(t, width):
                    self._unsafe(tag, f"its features are reshaped or reduced by '{name}' (not into heads)")
        if self._meets_replicated_heads(inputs):
            self._unsafe(tag, f"its heads meet a replicated per-head tensor in '{name}' (e.g. RoPE tables per head)")
        width = inputs[0].shape[-1] if inputs[0].dim() else None
        for t in outputs:
            keep = t.dim() and width is not None and t.shape[-1] == width
            set_tag(t, tag if keep else {s: None for s in tag})

    def _meets_replicated_heads(self, inputs: list[torch.Tensor]) -> bool:
        """Inside an attention module: an untagged operand with a dim of the module's head count (> 1), aligned
        (from the right, as broadcasting does) with a dim of that size of a tagged operand. Each rank would
        hold its own heads of one and all heads of the other."""
        owner = next((m for p, m in reversed(self.stack) if attention_spec(p, m, "") is not None), None)
        if owner is None:
            return False
        counts = {getattr(owner, a, None) for a in ("heads", "kv_heads", "num_heads", "num_kv_heads")}
        counts = {c for c in counts if isinstance(c, int) and c > 1}
        tagged = [t for t in inputs if tag_of(t) and t.dim() >= 2]
        replicated = [u for u in inputs if not tag_of(u) and u.dim() >= 2]
        return any(
            t.shape[-i] == u.shape[-i] and u.shape[-i] in counts
            for t in tagged
            for u in replicated
            for i in range(1, min(t.dim(), u.dim()) + 1)
        )

    def _is_head_view(self, t: torch.Tensor, width: int) -> bool:
        """`t` ends in [heads, head_dim] of `width` features, with head_dim that of the attention module running."""
        owner = next((p for p, m in reversed(self.stack) if attention_spec(p, m, "") is not None), None)
        head_dim = head_dim_of(self.model, owner) if owner else None
        return bool(head_dim) and t.dim() >= 2 and t.shape[-1] == head_dim and t.shape[-2] * head_dim == width

    def _attention(self, tag, qkv) -> None:
        owner = next((p for p, m in reversed(self.stack) if attention_spec(p, m, "") is not None), None)
        if owner is None:
            self._unsafe(tag, "its output reaches attention outside a module with `heads` (no head bookkeeping)")
        elif not all(isinstance(t, torch.Tensor) and tag_of(t) for t in qkv):
            self._unsafe(tag, f"its output meets replicated q/k/v in the attention of '{owner}'")

    def _cut(self, tag, pieces) -> None:
        for source, span in tag.items():
            if span is not None:
                self.flows[source].cuts.update(span[0] + o for p, o in pieces)
                self.flows[source].cuts.update(span[0] + o + p.shape[-1] for p, o in pieces)
        for piece, offset in pieces:
            width = piece.shape[-1]
            set_tag(
                piece, {s: None if sp is None else (sp[0] + offset, sp[0] + offset + width) for s, sp in tag.items()}
            )

    def _unsafe(self, tag, reason: str) -> None:
        for source in tag:
            if reason not in self.flows[source].unsafe:
                self.flows[source].unsafe.append(reason)

    def _top(self):
        return self.stack[-1][1] if self.stack else None

    def _head_dim_around(self, path: str) -> int | None:
        atoms = path.split(".")
        for depth in range(len(atoms) - 1, 0, -1):
            scope = ".".join(atoms[:depth])
            if attention_spec(scope, self.model.get_submodule(scope), "") is not None:
                return head_dim_of(self.model, scope)
        return None


# ---------------------------------------------------------------------------------------------
# from the trace to a plan


def trace(model: nn.Module, inputs: dict) -> tuple[dict[str, Flow], dict[str, str]]:
    """Flows where every Linear whose output is tagged could be colwise: unsafe ones and Linears that both
    consume and produce are dropped from the tagged set and the forward traced again, until none is left.

    Round 1 tags every Linear, so e.g. `x_embedder`'s and `to_out.0`'s outputs reach `norm2` through
    the residual stream (unsafe): they are dropped, and in round 2 the residual stream carries no
    tags. Only when nothing is unsafe are the Linears that both consume and produce dropped (the time
    embedder's `linear_2` consumes `linear_1` and feeds the modulations).
    Returns the last round's flows and {dropped Linear: why}.
    """
    starts, dropped = None, {}
    while True:
        flows = FlowTracer(model, starts).run(inputs)
        started = set(flows) if starts is None else starts & set(flows)
        # Unsafe outputs first: their tags are what make other Linears look like consumers.
        bad = {p for p in started if flows[p].unsafe} or _chain_breaks(flows, started, model)
        if not bad:
            return flows, dropped
        for path in bad:
            dropped[path] = (
                flows[path].unsafe[0]
                if flows[path].unsafe
                else "it would both consume and produce a sharded activation (a chain of Linears)"
            )
        starts = started - bad


def _chain_breaks(flows: dict[str, Flow], started: set[str], model: nn.Module) -> set[str]:
    """Where to break chains of Linears (one that both consumes and produces): at a source whose output only
    attention projections consume, several of them (Wan's text embedding feeds every block's attn2.to_k / to_v:
    left whole, so the attention pairs shard), else at the chain Linears themselves (a time embedding feeding
    modulations: the modulations are gathered instead)."""
    chain = {p for p in started if flows[p].consumers and flows[p].sources}
    shared = {
        s
        for p in chain
        for s in flows[p].sources
        if s in started and len(flows[s].consumers) > 1 and all(_in_attention(model, c) for c in flows[s].consumers)
    }
    return shared or chain


def _in_attention(model: nn.Module, path: str) -> bool:
    """`path` is a direct child of an attention module (its q/k/v/out projection)."""
    owner, _, _ = path.rpartition(".")
    return bool(owner) and attention_spec(owner, model.get_submodule(owner), "") is not None


def components(flows: dict[str, Flow]) -> list[list[str]]:
    """Linears joined by "output reaches input", each component in execution order."""
    parent = {p: p for p in flows}

    def find(p):
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    for path, flow in flows.items():
        for consumer in flow.consumers:
            if consumer in parent:
                parent[find(consumer)] = find(path)
    groups: dict[str, list[str]] = {}
    for path, flow in flows.items():
        if flow.consumers or flow.sources:
            groups.setdefault(find(path), []).append(path)
    return list(groups.values())


def pair_rules(group: list[str], flows: dict[str, Flow]) -> tuple[dict[str, tuple], str | None]:
    """({path: (style, blocks)}, None) for a component that can be colwise -> rowwise, else ({}, reason)."""
    producers = [p for p in group if flows[p].consumers]
    consumers = [p for p in group if flows[p].sources]
    both = [p for p in producers if p in consumers]
    if both:
        return {}, f"'{both[0]}' both consumes and produces a sharded activation (a chain of Linears)"
    for path in producers:
        if flows[path].unsafe:
            return {}, f"the output of '{path}': {flows[path].unsafe[0]}"
    for path in consumers:
        if flows[path].input_unsafe:
            return {}, f"the input of '{path}': {flows[path].input_unsafe[0]}"
    rules = {}
    for path in producers:
        blocks = flows[path].blocks()
        rules[path] = ("packed_colwise", _proportions(blocks)) if len(blocks) > 1 else ("colwise", None)
        rules.update({norm: ("rmsnorm_across_heads", None) for norm in flows[path].norms})
    for path in consumers:
        blocks = _input_blocks(flows[path], flows)
        rules[path] = ("packed_rowwise", _proportions(blocks)) if len(blocks) > 1 else ("rowwise", None)
    return rules, None


def _input_blocks(flow: Flow, flows: dict[str, Flow]) -> list[int]:
    """A consumer's input blocks: per piece, the producer's blocks inside the piece's span (else the piece)."""
    blocks = []
    for width, tag in flow.pieces:
        spans = [(s, span) for s, span in tag.items() if span is not None]
        if len(tag) == 1 and spans:
            source, (start, stop) = spans[0]
            edges = sorted({e for e in flows[source].cuts if start < e < stop} | {start, stop})
            blocks += [b - a for a, b in zip(edges, edges[1:])]
        else:
            blocks.append(width)
    return blocks


def _proportions(blocks: list[int]) -> tuple[int, ...]:
    unit = reduce(math.gcd, blocks)
    return tuple(b // unit for b in blocks)


def gathered_rules(flows: dict[str, Flow], taken: set[str], tp: int) -> dict[str, tuple]:
    """Linears outside every pair, applied to few rows, that `tp` divides: colwise_gathered."""
    busiest = max((f.rows for f in flows.values()), default=0)
    return {
        path: ("colwise_gathered", None)
        for path, flow in flows.items()
        if path not in taken and flow.rows * FEW_ROWS <= busiest and flow.out_features % tp == 0
    }


def fold(model: nn.Module, rules: dict[str, tuple]) -> dict[str, tuple]:
    """Per-module rules -> plan keys: `blocks.*.x` where every element of the ModuleList has the same rule."""
    by_glob: dict[str, dict[str, tuple]] = {}
    for path, rule in rules.items():
        match = re.match(r"^(.*?)\.(\d+)(\..*)?$", path)
        if match and isinstance(model.get_submodule(match[1]), nn.ModuleList):
            by_glob.setdefault(f"{match[1]}.*{match[3] or ''}", {})[path] = rule
        else:
            by_glob.setdefault(path, {})[path] = rule
    keys = {}
    for glob, members in by_glob.items():
        prefix = glob.partition(".*")[0]
        size = len(model.get_submodule(prefix)) if "*" in glob else 1
        if "*" in glob and len(members) == size and len(set(members.values())) == 1:
            keys[glob] = next(iter(members.values()))
        else:
            keys.update(members)
    return keys


def _plan(model: nn.Module, rules: dict[str, tuple], name: str) -> Plan:
    tp = {
        key: {"style": style, "blocks": list(blocks)} if blocks else style
        for key, (style, blocks) in fold(model, rules).items()
    }
    return Plan.from_dict({"tp": tp, "models": [type(model).__name__]}, name=name)


def suggest(model: nn.Module, example_inputs: dict | None = None, *, tp: int = 2) -> Suggestion:
    """The suggestion for `model` at TP degree `tp` (see the module docstring); PlanError when nothing is safe."""
    check_degree(tp, "suggest: tp")
    name = type(model).__name__
    if example_inputs is None:
        example_inputs = known_inputs(name, dict(getattr(model, "config", {})))
    flows, dropped = trace(model, example_inputs)
    accepted, notes = {}, []
    for group in components(flows):
        rules, reason = pair_rules(group, flows)
        if rules:
            reason = _refusal(model, rules, tp, name)
        if reason:
            notes.append(f"replicated: {', '.join(_folded(model, group))}: {reason}")
        else:
            accepted.update(rules)
    accepted.update(gathered_rules(flows, set(accepted), tp))
    notes += _dropped_notes(model, {p: why for p, why in dropped.items() if p not in accepted})
    if not accepted:
        raise PlanError(
            f"suggest: nothing in {name} can be sharded safely at tp={tp}: "
            + ("; ".join(notes) or "no Linear is applied to the example inputs")
        )
    plan = _plan(model, accepted, f"suggested for {name}")
    resolve(plan, model).check_tp(tp)  # every piece passed on its own; the whole must too
    return Suggestion(plan=plan, notes=tuple(notes), model=name)


def suggest_plan(model: nn.Module, example_inputs: dict | None = None, *, tp: int = 2) -> Plan:
    """A plan for `model` from one traced forward (`dtp.suggest_plan`); PlanError when nothing is safe."""
    return suggest(model, example_inputs, tp=tp).plan


def _refusal(model: nn.Module, rules: dict[str, tuple], tp: int, name: str) -> str | None:
    """Why this pair group fails the engine's checks at `tp` on its own (None: it passes)."""
    try:
        resolved = resolve(_plan(model, rules, f"suggested for {name}"), model)
        resolved.check_tp(tp)
        check_held_sizes(resolved, model)  # a size the module holds and reads (OvisImage's mlp_hidden_dim)
    except PlanError as exc:
        return str(exc)
    return None


def _dropped_notes(model: nn.Module, dropped: dict[str, str]) -> list[str]:
    """One line per plan key (globs folded) of the Linears left replicated because of their outputs."""
    by_key: dict[str, str] = {}
    for key in fold(model, {p: ("-", None) for p in dropped}):
        member = next(p for p in dropped if re.fullmatch(re.escape(key).replace(r"\*", r"\d+"), p))
        by_key[key] = dropped[member]
    return [f"replicated: {key}: {why}" for key, why in sorted(by_key.items())]


def _folded(model: nn.Module, paths: list[str]) -> list[str]:
    return sorted(fold(model, {p: ("-", None) for p in paths}))


def rank_fraction(model: nn.Module, plan: Plan, tp: int) -> float:
    """The share of all parameter bytes one rank holds under `plan` at `tp` (1.0: nothing sharded)."""
    layouts = resolve(plan, model).param_layouts()
    total = local = 0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        total += size
        local += size // tp if layouts.get(name) is not None else size
    return local / max(total, 1)
