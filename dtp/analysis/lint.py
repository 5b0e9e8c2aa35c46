"""Static lint of a plan: the classic TP mistakes, found from one unsharded traced forward.

Nothing runs sharded. While the model runs whole on one process, every tensor carries a tag
saying which planned colwise outputs it is computed from, and which features of them its last dim
holds (`[start, stop)` of the Linear's full output, while that is known). A colwise Linear's
output starts a tag, a rowwise or gathered Linear's output clears it (the all-reduce / all-gather
makes it whole), and every other torch function passes the union of its inputs' tags on
(`TagMode`, a `TorchFunctionMode`). Where the tags meet certain places, the plan is wrong:

    unpaired_colwise       a colwise output reaches no rowwise input in the same block (the
                           sharded activation leaks into the block output or a replicated Linear)
    replicated_rowwise     a rowwise Linear's input carries no colwise tag: each rank would use
                           its slice of the weight on the whole activation
    heads_not_local        sharded q/k/v reach `scaled_dot_product_attention` inside an attention
                           module whose head bookkeeping the plan does not rewrite
    norm_across_heads      a norm over the last dim of a sharded activation whose features span
                           more than one head (Wan-style QK-norm over inner_dim): each rank would
                           normalize over its own slice only
    split_across_blocks    `chunk`/`split`/`tensor_split` or `x[..., a:b]` of a colwise output along
                           the features at a place that is not a block boundary of the plan (a
                           plain colwise SwiGLU projection: `x.chunk(2, dim=-1)` or
                           `x[..., :half]` cuts [gate | up] in the middle, but every rank holds
                           half of each)
    cat_into_plain_rowwise a plain rowwise Linear takes `cat([a, b], dim=-1)` of sharded pieces:
                           its input blocks are those pieces (packed_rowwise)

Example: FLUX.2 with `ff.linear_in: colwise` gives split_across_blocks at
`transformer_blocks.0.ff.linear_in` (`x[..., :192]` cuts its 384 features; blocks [384]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

from ..errors import PlanError
from ..families import FAMILIES
from ..families.tiny import tiny_inputs, tiny_model
from ..plan import Plan, plan_for
from ..resolve import Resolved, resolve
from ..resolve.binding.globs import attention_optional, expand
from ..resolve.binding.heads import attention_spec, resolve_attention
from ..resolve.binding.linears import resolve_linears
from ..resolve.binding.norms import resolve_norms
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

RULES = (
    "unpaired_colwise",
    "replicated_rowwise",
    "heads_not_local",
    "norm_across_heads",
    "split_across_blocks",
    "cat_into_plain_rowwise",
)


@dataclass(frozen=True)
class Finding:
    """One lint: the rule, the module it is about, the plan key that governs it, and the explanation."""

    rule: str
    path: str
    key: str | None
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.path}: {self.message}"


def bind(model: nn.Module, plan: Plan | None, checks: bool = True) -> Resolved:
    """`resolve(plan, model)`, or with `checks=False` without the pair rule and the attention checks:
    then only the listed attention modules get head bookkeeping. The unchecked form is for looking
    at a plan the checks refuse (lint, verify); never for serving."""
    plan = plan if plan is not None else plan_for(model)
    if checks:
        return resolve(plan, model)
    linears = resolve_linears(plan, model)
    if plan.attention is None:
        attention = resolve_attention(plan, model, linears)
    else:
        found = [
            attention_spec(path, module, key)
            for key in plan.attention
            for path, module in expand(model, key, plan.name, optional=attention_optional(plan, key))
        ]
        attention = [spec for spec in found if spec is not None]
    try:
        norms = resolve_norms(plan, model, linears, [spec.path for spec in attention])
    except PlanError:  # a norm across heads the plan leaves out: the trace reports it (norm_across_heads)
        norms = ()
    constraints = [c for spec in (*linears, *attention, *norms) for c in spec.constraints()]
    return Resolved(plan, tuple(linears), tuple(attention), tuple(constraints), norms=tuple(norms))


@torch.no_grad()
def lint(model: nn.Module, plan: Plan | None, example_inputs: dict) -> list[Finding]:
    """Every finding of one traced forward of `model` (unsharded, left untouched) on `example_inputs`."""
    tracer = Tracer(model, bind(model, plan, checks=False))
    tracer.run(example_inputs)
    return tracer.findings()


class Tracer:
    """One traced forward: module hooks start and clear tags; `TagMode` moves them through torch functions."""

    def __init__(self, model: nn.Module, resolved: Resolved):
        self.model = model
        self.specs = {spec.path: spec for spec in resolved.linears}
        self.attention = {spec.path for spec in resolved.attention}
        self.norms = {spec.path for spec in resolved.norms}  # distributed norms (rmsnorm_across_heads): exact
        self.stack: list[str] = []
        self.consumers: dict[str, set[str]] = {}  # colwise path -> rowwise paths its output reached
        self.leaks: dict[str, str] = {}  # colwise path -> first place its output went instead
        self.ran: list[str] = []  # sharded-output Linears, in execution order
        self.found: dict[tuple[str, str], Finding] = {}

    def run(self, inputs: dict) -> None:
        for tensor in tree_leaves(traced_forward(self.model, inputs, self)):
            self._leak(tag_of(tensor), "the model output")

    # -- module boundaries ----------------------------------------------------------------------

    def enter(self, path: str, module: nn.Module, args) -> None:
        self.stack.append(path)
        x = args[0] if args else None
        spec = self.specs.get(path)
        if spec is not None and spec.style.shard_dim == 1:
            self._check_rowwise(spec, x)
        elif spec is None and isinstance(module, nn.Linear) and tag_of(x):
            self._leak(tag_of(x), f"the replicated Linear '{path}'")
        elif is_norm(module) and tag_of(x) and path not in self.norms:
            self._check_norm(path, x)

    def leave(self, path: str, module: nn.Module, output) -> None:
        self.stack.pop()
        spec = self.specs.get(path)
        if spec is None or not isinstance(output, torch.Tensor):
            return
        if spec.style.shard_dim == 0 and not spec.style.gathers_output:
            # a depthwise conv filters the sharded channels it is fed: they still come from the layer before it
            passed = tag_of(output) if getattr(spec.style, "depthwise", False) else {}
            set_tag(output, {**passed, path: (0, sum(spec.sizes))})
            self.ran.append(path)
        else:
            set_tag(output, {})

    def _check_rowwise(self, spec, x) -> None:
        tag = tag_of(x)
        if not tag:
            self._add(
                "replicated_rowwise",
                spec,
                "its input is computed from no colwise output (a replicated activation); each rank would multiply "
                "the whole activation by its slice of the weight. Pair it with the colwise layer(s) that produce "
                "its input, or leave it replicated.",
            )
            return
        for source in tag:
            self.consumers.setdefault(source, set()).add(spec.path)
        pieces = getattr(x, "_dtp_lint_cat", None)
        if pieces and len(spec.sizes) == 1 and len(pieces) > 1:
            self._add(
                "cat_into_plain_rowwise",
                spec,
                f"its input is cat({pieces}, dim=-1) of sharded pieces, so each rank holds a slice of every piece; "
                f"use packed_rowwise with blocks {pieces}.",
            )

    def _check_norm(self, path: str, x) -> None:
        """A norm over the last dim is per rank exact only when that dim is one head (or less) of features."""
        width = x.shape[-1]
        for source, span in tag_of(x).items():
            owner = self._attention_of(source)
            head_dim = (head_dim_of(self.model, owner) if owner else None) or 0
            if span is not None and width > head_dim:
                self._add(
                    "norm_across_heads",
                    self.specs[source],
                    f"'{path}' normalizes over the last dim ({width} features) of its sharded output"
                    + (f", i.e. across heads of {head_dim}" if head_dim else "")
                    + "; each rank would normalize over its own slice. It needs a distributed "
                    "norm (sharded weight, all-reduced sum of squares); leave the projection replicated until then.",
                )

    # -- torch functions ------------------------------------------------------------------------

    def on_function(self, func, args, kwargs, out) -> None:
        """Move the tags from `args`/`kwargs` to `out`, checking splits and attention on the way."""
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        tag = union([tag_of(t) for t in inputs])
        if not tag:
            return
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if getattr(func, "__name__", "") in SPLITS and len(outputs) > 1 and on_last_dim(args, kwargs, 2):
            offsets = [sum(t.shape[-1] for t in outputs[:i]) for i in range(len(outputs))]
            self._cut(tag, list(zip(outputs, offsets)))
            return
        start = feature_slice_start(func, args)
        if start is not None and isinstance(out, torch.Tensor):
            self._cut(tag, [(out, start)])
            return
        if func is F.scaled_dot_product_attention:
            self._check_attention(tag)
        if func is torch.cat and on_last_dim((args[0][0], *args[1:]), kwargs, 1):
            for t in outputs:
                set_tag(t, {s: None for s in tag})
                t._dtp_lint_cat = [int(x.shape[-1]) for x in args[0] if isinstance(x, torch.Tensor)]
            return
        width = inputs[0].shape[-1] if inputs[0].dim() else None
        for t in outputs:
            keep = t.dim() and width is not None and t.shape[-1] == width
            set_tag(t, tag if keep else {s: None for s in tag})

    def _cut(self, tag: dict, pieces: list[tuple[torch.Tensor, int]]) -> None:
        """Tag each (piece, offset in the input's features); every cut must fall on a block boundary."""
        for source, span in tag.items():
            if span is None:
                continue
            spec = self.specs[source]
            bounds = {sum(spec.sizes[:i]) for i in range(len(spec.sizes) + 1)}
            cuts = sorted({span[0] + o for p, o in pieces} | {span[0] + o + p.shape[-1] for p, o in pieces})
            bad = [c for c in cuts if c not in bounds]
            if bad:
                self._add(
                    "split_across_blocks",
                    spec,
                    f"its output is cut along the features at {cuts} (of {sum(spec.sizes)}), but the plan's blocks "
                    f"{list(spec.sizes)} have boundaries {sorted(bounds)}: every rank holds a slice of each block, "
                    f"so the pieces mix features. Use packed_colwise with blocks matching the cut.",
                )
        for piece, offset in pieces:
            width = piece.shape[-1]
            set_tag(
                piece, {s: None if sp is None else (sp[0] + offset, sp[0] + offset + width) for s, sp in tag.items()}
            )

    def _check_attention(self, tag: dict) -> None:
        owner = next((p for p in reversed(self.stack) if attention_spec(p, self.model.get_submodule(p), "")), None)
        if owner is not None and owner not in self.attention:
            source = next(iter(tag))
            self._add(
                "heads_not_local",
                self.specs[source],
                f"sharded projections reach attention inside '{owner}', whose head counts the plan does not rewrite "
                f"per rank (heads={self.model.get_submodule(owner).heads}); add its glob to `attention`.",
                path=owner,
            )

    # -- bookkeeping ----------------------------------------------------------------------------

    def _leak(self, tag: dict, where: str) -> None:
        for source in tag:
            self.leaks.setdefault(source, where)

    def _attention_of(self, path: str) -> str | None:
        atoms = path.split(".")
        for depth in range(len(atoms) - 1, 0, -1):
            scope = ".".join(atoms[:depth])
            if attention_spec(scope, self.model.get_submodule(scope), "") is not None:
                return scope
        return None

    def _add(self, rule: str, spec, message: str, path: str | None = None) -> None:
        path = path or spec.path
        self.found.setdefault((rule, path), Finding(rule, path, spec.rule.key, message))

    def findings(self) -> list[Finding]:
        for path in self.ran:
            block = block_of(self.model, path)
            paired = [r for r in self.consumers.get(path, ()) if block_of(self.model, r) == block]
            if not paired or path in self.leaks:
                went = self.leaks.get(path, "none")
                self._add(
                    "unpaired_colwise",
                    self.specs[path],
                    f"its sharded output must reach only rowwise Linears in '{block or '<model>'}', but it reaches "
                    f"{went}; pair it with the rowwise layer that consumes it, or make it colwise_gathered.",
                )
        return list(self.found.values())


def block_of(model: nn.Module, path: str) -> str:
    """The repeated block a module belongs to: its path up to the first element of a list of repeated blocks
    (`transformer_blocks.3`); "" (the model) outside any. A ModuleList of modules of different classes is a
    sequence of layers, not of blocks (diffusers' FeedForward.net: [GELU, Dropout, Linear]): a FeedForward outside
    the block lists (Wan Animate's image embedder) is one unit, its `net.0.proj` paired with its `net.2`."""
    atoms = path.split(".")
    module = model
    for i, atom in enumerate(atoms):
        if isinstance(module, nn.ModuleList) and len({type(m) for m in module}) == 1:
            return ".".join(atoms[: i + 1])
        module = module._modules.get(atom) if module is not None else None
    return ""


def lint_report(class_name: str, plan: Plan | None) -> dict:
    """`{"findings": [...], "note": ...}` for `dtp check`: the lint of `plan` on the class's tiny model.

    The lint needs one real forward, so it runs on the tiny config (`dtp.families`) with random
    weights; a class without one, or a plan whose keys address blocks the tiny model lacks, is noted.
    """
    if class_name not in FAMILIES:
        return {"findings": None, "note": f"no tiny config for {class_name}: not linted"}
    try:
        found = lint(tiny_model(class_name), plan, tiny_inputs(class_name))
    except PlanError as exc:
        return {"findings": None, "note": f"not linted on the tiny model: {exc}"}
    return {"findings": [f.__dict__ for f in found], "note": None}


def format_lint(report: dict) -> list[str]:
    if report["findings"] is None:
        return [f"lint: {report['note']}"]
    if not report["findings"]:
        return ["lint (one traced forward of the tiny model): clean"]
    lines = [f"lint (one traced forward of the tiny model): {len(report['findings'])} finding(s)"]
    return lines + [f"  [{f['rule']}] {f['path']}: {f['message']}" for f in report["findings"]]
