"""`dtp.verify` / `dtp verify`: where a plan goes wrong, module by module, against one device.

A wrong plan usually runs and gives plausible numbers; comparing final images says *that* it is
wrong, not *where*. Here every rank builds the same model twice, runs it whole and sharded on the
same inputs, and compares, at every planned Linear (input and output) and every attention module
(output), what this rank holds with what it should hold under the plan:

    colwise / packed_colwise   input whole,                 output = Layout(-1, blocks).local_slice(ref)
    rowwise / packed_rowwise   input = Layout(-1, blocks).local_slice(ref),  output whole
    colwise_gathered           input whole,                 output whole
    attention module           each output whole, or, where the module has no output projection
                               (FLUX.1 single-stream), this rank's heads: Layout(-1, [width])
    model                      output whole

    rel = max |sharded - expected| / max |expected|     (per site, the max over ranks)

The first site in execution order with `rel > tol` is where the plan goes wrong, and the pair
structure says why. Example: FLUX.2's SwiGLU `ff.linear_in` split as plain colwise. Each rank's
output is exactly rows `r * 2h / tp : (r + 1) * 2h / tp` of the full one (its output site
matches), but `chunk(2)` then pairs gate and up features that do not belong together, so the
first site that diverges is the *input* of `ff.linear_out`; the suspects are the colwise layers
that feed it in the same scope: `ff.linear_in` (it needs `packed_colwise`, blocks [1, 1]).
A sharded run that raises is reported with the innermost planned or attention module that was
running.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field, replace
from functools import partial

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..choices import DEFAULT_TOL
from ..engine import Prepared, apply, prepare
from ..families import FAMILIES
from ..families import example_inputs as known_inputs
from ..families.tiny import random_model
from ..plan import Plan, load_plan
from ..policy import check_degree
from ..resolve import Layout, Resolved
from ..resolve.binding.heads import attention_spec
from ..runtime.mesh import make_mesh
from ..runtime.parallelism import Parallelism
from .launch import spawn
from .lint import Finding, bind, lint

ATTENTION = "attention"  # the `kind` of an attention module's site
MODEL = "model"  # the `kind` of the model's own output (path "")
HEADS = "heads"  # expected layout of an attention output that stays sharded: this rank's heads


@dataclass(frozen=True)
class Site:
    """One compared tensor: `path`'s `where` ("input"/"output") on its `call`-th call, `rel` its difference."""

    path: str
    where: str
    call: int
    kind: str  # the plan style, ATTENTION or MODEL
    rel: float

    def label(self) -> str:
        name = self.path or "<model>"
        return f"{self.where} of {name}" + (f" (call {self.call})" if self.call else "")


@dataclass(frozen=True)
class VerifyReport:
    """Per-site relative differences of a sharded forward, in execution order, and the diagnosis."""

    model: str
    plan: str
    tp: int
    tol: float
    sites: tuple[Site, ...]
    entries: dict = field(default_factory=dict)  # path -> what the plan says about it
    error: str | None = None  # the sharded forward raised (first line), with the modules running:
    error_stack: tuple[str, ...] = ()
    lint: tuple[Finding, ...] = ()  # the static findings for the same plan (`dtp.analysis.lint`)

    @property
    def first(self) -> Site | None:
        """The first site in execution order that diverges beyond `tol` (None: none does)."""
        return next((s for s in self.sites if not s.rel <= self.tol), None)

    @property
    def ok(self) -> bool:
        return self.error is None and self.first is None

    @property
    def output_rel(self) -> float | None:
        return next((s.rel for s in self.sites if s.kind == MODEL), None)

    def suspects(self) -> list[str]:
        """The modules whose plan entries most likely cause the first failure (empty when ok)."""
        if self.error is not None:
            named = [p for p in self.error_stack if p in self.entries]
            return named[-1:] or list(self.error_stack[-1:])
        first = self.first
        if first is None:
            return []
        if first.where == "input" and first.kind in ("rowwise", "packed_rowwise"):
            return self._producers(first.path) or [first.path]
        return [first.path]

    def _producers(self, path: str) -> list[str]:
        """Attention modules and sharded-output Linears in the nearest scope around `path` that has any.

        The input of a rowwise layer is computed from those outputs (which matched their layouts),
        so the layout they are split with is not the one the code between reads them with.
        """
        atoms = path.split(".")
        for depth in range(len(atoms) - 1, -1, -1):
            scope = ".".join(atoms[:depth])
            prefix = f"{scope}." if scope else ""
            kinds = self._kinds()
            found = [p for p, kind in kinds.items() if p != path and p.startswith(prefix) and _feeds_rowwise(kind)]
            found += [scope] if kinds.get(scope) == ATTENTION else []
            if found:
                return sorted(set(found), key=lambda p: (p != scope, p))
        return []

    def _kinds(self) -> dict[str, str]:
        return {s.path: s.kind for s in self.sites}

    def to_dict(self) -> dict:
        first = self.first
        return {
            "model": self.model,
            "plan": self.plan,
            "tp": self.tp,
            "tol": self.tol,
            "ok": self.ok,
            "output_rel": self.output_rel,
            "error": self.error,
            "error_stack": list(self.error_stack),
            "first": None if first is None else {**first.__dict__, "entry": self.entries.get(first.path)},
            "suspects": [{"path": p, "entry": self.entries.get(p)} for p in self.suspects()],
            "sites": [s.__dict__ for s in self.sites],
            "lint": [f.__dict__ for f in self.lint],
        }

    def format(self, verbose: bool = True) -> str:
        """The report as text: a header, the per-site table (`verbose`; else a line of counts), lint, the verdict."""
        lines = [f"dtp verify: {self.model}, plan {self.plan}, tp={self.tp} (tolerance {self.tol:g} relative)"]
        if verbose:
            for s in self.sites:
                lines.append(f"  {s.rel:10.3e} {' ' if s.rel <= self.tol else '!'} {s.label()}  [{s.kind}]")
        else:
            lines.append(self._counts())
        lines += [f"lint: {finding}" for finding in self.lint]
        if self.ok:
            lines.append(f"OK: every site within {self.tol:g} (model output {self.output_rel:.3e}).")
            return "\n".join(lines)
        if self.error is not None:
            lines.append(f"FAILED: the sharded forward raised: {self.error}")
            lines.append(f"  while running: {' > '.join(self.error_stack) or '<model>'}")
        else:
            first = self.first
            lines.append(f"DIVERGES first at the {first.label()}: relative difference {first.rel:.3e} > {self.tol:g}")
        lines += [f"  suspect {p}: {self.entries.get(p, 'not in the plan')}" for p in self.suspects()]
        return "\n".join(lines)

    def _counts(self) -> str:
        """`12 sites compared, 3 beyond tolerance (largest 4.1e-01 at ...); per site: --verbose`."""
        beyond = [s for s in self.sites if not s.rel <= self.tol]
        worst = max(beyond, key=lambda s: s.rel if math.isfinite(s.rel) else math.inf, default=None)
        largest = f" (largest {worst.rel:.3e} at the {worst.label()})" if worst else ""
        return f"  {len(self.sites)} sites compared, {len(beyond)} beyond tolerance{largest}; per site: --verbose"


def _feeds_rowwise(kind: str) -> bool:
    return kind in ("colwise", "packed_colwise")


# ---------------------------------------------------------------------------------------------
# the public entry point (spawns the ranks)


def verify(
    model,
    plan=None,
    tp: int = 2,
    example_inputs: dict | None = None,
    *,
    tol: float = DEFAULT_TOL,
    checks: bool = True,
    config: dict | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Run `model` whole and sharded with `plan` on `tp` local gloo processes; compare every site.

    model: an `nn.Module` (sent to the ranks as a pickled copy; left untouched), a zero-argument
        picklable factory, or a diffusers class name (built from `config`, default its tiny config,
        with weights drawn from `seed`).
    plan: a `Plan`, a bundled plan name or YAML path, or None for `plan_for(model)`.
    example_inputs: forward keyword arguments; default `dtp.families.example_inputs` for known classes.
    checks: False binds the plan without the pair, attention-ownership and head-listing checks (the
        paths, Linear targets, blocks and divisibility are still checked), to see what a plan those
        checks refuse would do.
    """
    build, name, cfg = _builder(model, config, seed)
    if example_inputs is None:
        example_inputs = known_inputs(name, cfg)
    plan = load_plan(plan) if isinstance(plan, str) else plan
    sample = build()
    check_degree(tp, "verify: tp")
    bind(sample, plan, checks).check_tp(tp)  # PlanError here, before any process starts
    findings = tuple(lint(sample, plan, example_inputs))
    results = spawn(compare_worker, tp, build, plan, example_inputs, checks)
    return replace(merge(results, model=name, tol=tol), lint=findings)


def _config_dict(model: nn.Module) -> dict:
    """A diffusers model's config (a dict); a transformers config (an object) gives no diffusers input builder."""
    config = getattr(model, "config", {})
    return dict(config) if isinstance(config, dict) else {}


def _builder(model, config: dict | None, seed: int):
    """(picklable zero-argument factory, class name, config) for the three kinds of `model`."""
    if isinstance(model, str):
        cfg = dict(config if config is not None else FAMILIES[model].tiny if model in FAMILIES else {})
        return partial(random_model, model, cfg, seed), model, cfg
    if isinstance(model, nn.Module):
        buffer = io.BytesIO()
        torch.save(model, buffer)
        return partial(_unpickle, buffer.getvalue()), type(model).__name__, _config_dict(model)
    if callable(model):
        sample = model()
        return model, type(sample).__name__, _config_dict(sample)
    raise TypeError(f"verify: model must be an nn.Module, a factory or a class name, got {type(model).__name__}")


def _unpickle(data: bytes) -> nn.Module:
    return torch.load(io.BytesIO(data), weights_only=False)


def merge(rank_results: list[dict], *, model: str, tol: float = DEFAULT_TOL) -> VerifyReport:
    """One report from every rank's `compare_worker` result: per site the largest difference of any rank."""
    first = rank_results[0]
    rel = {}
    for result in rank_results:
        for site in result["sites"]:
            key = (site.path, site.where, site.call)
            rel[key] = max(rel.get(key, 0.0), site.rel, key=lambda v: math.inf if math.isnan(v) else v)
    sites = tuple(Site(s.path, s.where, s.call, s.kind, rel[(s.path, s.where, s.call)]) for s in first["sites"])
    failed = next((r for r in rank_results if r["error"] is not None), None)
    return VerifyReport(
        model=model,
        plan=first["plan"],
        tp=len(rank_results),
        tol=tol,
        sites=sites,
        entries=first["entries"],
        error=None if failed is None else failed["error"],
        error_stack=() if failed is None else tuple(failed["stack"]),
    )


# ---------------------------------------------------------------------------------------------
# inside the process group


def compare_worker(rank: int, world_size: int, build, plan: Plan | None, inputs: dict, checks: bool = True) -> dict:
    """`spawn` target: a tp=`world_size` mesh, then `compare_sharded`."""
    return compare_sharded(build, plan, inputs, make_mesh(tp=world_size), checks=checks)


@torch.no_grad()
def compare_sharded(build, plan: Plan | None, inputs: dict, mesh, *, checks: bool = True) -> dict:
    """Run `build()` whole and `build()` sharded on `inputs`; this rank's site differences (see module doc).

    Returns {"plan", "entries", "sites": [Site], "error": str | None, "stack": [module paths running]}.
    """
    sharded = build()
    if checks:
        prepared = prepare(sharded, mesh, plan)
    else:
        prepared = Prepared(bind(sharded, plan, checks=False), None, Parallelism(mesh))
        prepared.resolved.check_tp(prepared.tp)  # the slicing is undefined otherwise
    expected = site_layouts(sharded, prepared.resolved)
    reference = _record(build(), expected, inputs)
    apply(sharded, prepared)
    tp_mesh = prepared.tp_mesh
    sites, stack, error = _compare(sharded, expected, inputs, reference, tp_mesh.size(), tp_mesh.get_local_rank())
    return {
        "plan": prepared.plan.name,
        "entries": plan_entries(sharded, prepared.resolved),
        "sites": sites,
        "error": error,
        "stack": stack,
    }


def site_layouts(model: nn.Module, resolved: Resolved) -> dict[str, tuple[str, Layout | None, Layout | None]]:
    """path -> (kind, expected input layout, expected output layout) of every recorded module.

    Layouts use dim -1 (the features); None means every rank holds the tensor whole.
    """
    sites: dict[str, tuple] = {"": (MODEL, None, None)}
    for path, module in model.named_modules():
        if path and attention_spec(path, module, "") is not None:
            # Whole when the module ends in its output projection, this rank's heads where it does not
            # (FLUX.1 single-stream, SD3's context-only last block): told apart by shape (see `_relative`).
            sites[path] = (ATTENTION, None, HEADS)
    for spec in resolved.linears:
        layout = replace(spec.weight_layout, dim=-1)  # padded and shared-kv layouts as the weights are cut
        if spec.style.gathers_output:
            sites[spec.path] = (spec.style.value, None, None)
        elif spec.style.shard_dim == 0:
            sites[spec.path] = (spec.style.value, None, layout)
        else:
            sites[spec.path] = (spec.style.value, layout, None)
    return sites


def plan_entries(model: nn.Module, resolved: Resolved) -> dict[str, str]:
    """path -> the plan entry that governs it, in words (for the report)."""
    entries = {}
    for path, module in model.named_modules():
        spec = attention_spec(path, module, "") if path else None
        if spec is not None:
            entries[path] = f"attention module not listed: heads={spec.counts()[0]} stay global"
    for spec in resolved.attention:
        values = ", ".join(f"{attr}={value}" for attr, value in spec.values)
        entries[spec.path] = f"attention '{spec.key}': per-rank bookkeeping of {values}"
    for spec in resolved.linears:
        blocks = f", blocks {list(spec.rule.blocks)}" if spec.rule.blocks else ""
        entries[spec.path] = f"'{spec.rule.key}': {spec.style.value}{blocks} (sizes {list(spec.sizes)})"
    return entries


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a module's input or output (tensor, tuple/list, diffusers output), local parts."""
    if isinstance(value, DTensor):
        return [value.to_local()]
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _hook_all(model: nn.Module, expected: dict, on_site, stack: list[str] | None = None) -> list:
    """Forward hooks: `on_site(path, where, call, tensors)` at every expected site; `stack` tracks modules."""
    handles, calls = [], {}

    def pre(path, module, args):
        if stack is not None:
            stack.append(path)
        if path in expected and expected[path][0] not in (ATTENTION, MODEL):  # Linears: inputs too
            on_site(path, "input", calls.get(path, 0), _tensors(args[:1]))

    def post(path, module, args, output):
        if stack is not None:
            stack.pop()
        if path in expected:
            on_site(path, "output", calls.get(path, 0), _tensors(output))
            calls[path] = calls.get(path, 0) + 1

    for path, module in model.named_modules():
        if path in expected or stack is not None:
            handles.append(module.register_forward_pre_hook(partial(pre, path)))
            handles.append(module.register_forward_hook(partial(post, path)))
    return handles


def _record(model: nn.Module, expected: dict, inputs: dict) -> dict:
    """(path, where, call) -> the reference tensors, from one whole forward."""
    recorded = {}

    def on_site(path, where, call, tensors):
        recorded[(path, where, call)] = [t.detach().float().clone() for t in tensors]

    handles = _hook_all(model, expected, on_site)
    model(**inputs)
    for h in handles:
        h.remove()
    return recorded


def _compare(model, expected, inputs, reference, tp, rank) -> tuple[list[Site], list[str], str | None]:
    sites, stack = [], []

    def on_site(path, where, call, tensors):
        ref = reference.get((path, where, call))
        if ref is None:
            return
        kind, in_layout, out_layout = expected[path]
        layout = in_layout if where == "input" else out_layout
        sites.append(Site(path, where, call, kind, _relative(tensors, ref, layout, tp, rank)))

    handles = _hook_all(model, expected, on_site, stack)
    error = None
    try:
        model(**inputs)
    except Exception as exc:  # the report names where it happened; the ranks tear down together after
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    for h in handles:
        h.remove()
    return sites, (stack if error else []), error


def _heads_block(got: torch.Tensor, ref: torch.Tensor) -> Layout | None:
    """None when `got` is whole; else this rank's heads along the one dim that differs: the features (-1) of
    an attention output, dim 1 of transformers' attention weights `[batch, heads, q, k]`."""
    dims = [d for d in range(ref.dim()) if got.dim() == ref.dim() and got.shape[d] != ref.shape[d]]
    if len(dims) != 1:
        return None
    return Layout(dims[0] - ref.dim(), (ref.shape[dims[0]],))


def _relative(got: list[torch.Tensor], ref: list[torch.Tensor], layout, tp: int, rank: int) -> float:
    """max |got - expected| / max |expected| over the tensors; inf when the shapes do not match."""
    if len(got) != len(ref):
        return math.inf
    diff, scale = 0.0, 0.0
    for g, r in zip(got, ref):
        block = layout
        if layout == HEADS:  # whole, or one contiguous block of this rank's heads: the shape says which
            block = _heads_block(g, r)
        want = r if block is None else block.local_slice(r, tp, rank)
        if g.shape != want.shape:
            return math.inf
        diff = max(diff, float((g.float() - want).abs().max()) if g.numel() else 0.0)
        scale = max(scale, float(want.abs().max()) if want.numel() else 0.0)
    return diff / max(scale, 1e-30)
