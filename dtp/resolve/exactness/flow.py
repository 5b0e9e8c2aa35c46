"""The sharded forward's data flow, checked before anything is sharded: one forward of a meta copy with local shapes.

Static rules (pairs, heads, alignment) cannot see where an activation goes: a colwise output that
reaches a replicated Linear, a rowwise Linear fed a whole activation, a shard left on the residual
stream. The forward can. So `check_flow` runs it, exactly as rank r will, but on the meta device:

    copy     the model with every parameter and buffer replaced by a meta tensor of its shape (no bytes)
    shard    every planned parameter -> `Layout.local_shape` (the slices `apply` will cut, padding and
             kv sharing included); attention counts -> `AttentionSpec.local_values(tp)`; a gathered
             output -> its full width again; a `shard_output` table -> its cut
    run      one forward on the model's example inputs (meta tensors), as every rank will

A forward that raises (`mat1 and mat2 shapes cannot be multiplied`, a broadcast of a local width
against a whole one), or that returns other shapes than the unsharded copy, is refused with a
PlanError naming the module it failed in and the planned layer that fed it. The unsharded copy is
run too (once per model structure). When it cannot run on plain meta tensors because a shape depends
on a value (HiDream's MoE `bincount`, Lumina2's `.tolist()` of the caption mask, Qwen-Image 2.1's
`repeat_interleave` of its image-token mask, Mochi's `autocast("meta")`), both run again with the
inputs' values carried along (`meta_values.py`). Only a class without example inputs, or a forward
that still fails, skips the check (the static rules stand alone). Results are cached per (model
class, structure, resolved plan, tp) in a bounded cache (`memo.py`), so `prepare` pays once per plan.
Cost of the first call at full size on meta (fake group, one loaded CPU core, CPU time): FLUX.2-dev tp=8 0.36 s (0.08 s
without this check), HiDream-I1 tp=4 1.2 s, Mochi 0.65 s, Lumina2 0.43 s, Qwen-Image 2.1 0.33 s.

Two things the meta kernels do not check are checked here: an indexed write whose value does not
broadcast to the indexed shape (`x[:, mask] = y`: `meta_values.StrictIndexPut`; Qwen-Image 2.1 with
`img_in` colwise wrote a quarter-width activation into the whole-width joint sequence), and a
`shard_output` table reaching attention whose heads are whole (`tables.py`: it can broadcast).

Values are not computed: a shard that keeps every shape right and is still wrong (heads out of
order) is what `alignment.py` refuses.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from ...errors import PlanError
from ...families import FAMILIES
from ...families import example_inputs as family_example_inputs
from ..binding.linears import LinearSpec
from ..binding.resolved import Resolved
from .memo import BoundedCache
from .meta_values import attach, strict_index_put, values_run
from .tables import TableWatch

# class name -> builder(config dict) -> forward keyword arguments, for classes outside `dtp.families` (whose own
# input builders come first).
EXAMPLE_INPUTS: dict[str, Callable[[dict], dict]] = {}
TEXT_TOKENS = 8  # transformers text encoders: one prompt of this many token ids
# (class, structure, plan, tp) digest -> None (fine) or the PlanError message
_RESULTS = BoundedCache("flow results", maxsize=256)
# (class, structure, thinning, mode) digest -> output shapes, or a _Failure
_BASELINES = BoundedCache("flow baselines", maxsize=64)


def _family_inputs(class_name: str, config: dict) -> dict:
    """The family's example inputs (`dtp.families`), with guidance when the model embeds it."""
    kwargs = family_example_inputs(class_name, config)
    if config.get("guidance_embeds") and "guidance" not in kwargs:
        kwargs["guidance"] = torch.full((1,), 3.5)
    return kwargs


def register_example_inputs(class_name: str, builder: Callable[[dict], dict]) -> None:
    """Let `check_flow` run models of `class_name`: `builder(config)` returns one forward's keyword arguments."""
    EXAMPLE_INPUTS[class_name] = builder


def check_flow(resolved: Resolved, model: nn.Module, tp: int) -> None:
    """PlanError when rank 0's sharded forward (on meta tensors) fails or changes the output shapes. Mutates nothing.

    `resolved` is bound to `tp` (padded, kv shared). A no-op at tp = 1, for a model without example
    inputs, and for one whose unsharded forward cannot run on the meta device.
    """
    if tp == 1:
        return
    structure = _structure_digest(model)
    key = _digest(structure, repr(resolved), str(tp))
    failure = _RESULTS.get_or_compute(key, lambda: _first_failure(resolved, model, tp, structure))
    if failure is not None:
        raise PlanError(failure)


def _first_failure(resolved: Resolved, model: nn.Module, tp: int, structure: str) -> str | None:
    inputs = example_inputs(model)
    if inputs is None:
        return None
    keep, values, baseline = _runnable(model, inputs, representatives(model, resolved), structure)
    if isinstance(baseline, _Failure):  # not even the unsharded model runs on meta tensors: nothing to learn
        return None
    trace: list[str] = []
    clone, where = meta_copy(model, keep)
    shard_meta(clone, resolved, tp, where)
    tables = TableWatch(clone, resolved, where, _unthinned(keep))
    result = _run(clone, inputs, trace, _unthinned(keep), values)
    specs = {spec.path: spec for spec in resolved.linears}
    if isinstance(result, _Failure):
        linears = {path for path, module in model.named_modules() if isinstance(module, nn.Linear)}
        return _crash_message(resolved, specs, tp, result, trace, linears)
    if tables.failure(resolved, tp) is not None:
        return tables.failure(resolved, tp)
    if result != baseline:
        return _shape_message(resolved, specs, tp, result, baseline, trace)
    return None


def _runnable(model: nn.Module, inputs: dict, keep: dict[str, list[int]], structure: str):
    """(keep, values, baseline): the first way the unsharded meta forward runs (or the last `_Failure`).

    Plain meta tensors first; then with known values (`meta_values.py`, for data-dependent shapes);
    then both again with every repeated block kept (when the blocks cannot be thinned out)."""
    for kept in (keep, {}):
        for values in (False, True):
            baseline = _baseline(model, inputs, kept, values, structure)
            if not isinstance(baseline, _Failure):
                return kept, values, baseline
    return {}, True, baseline


def _baseline(model: nn.Module, inputs: dict, keep: dict[str, list[int]], values: bool, structure: str):
    """The unsharded meta forward's output shapes (or its `_Failure`), cached per structure, thinning and mode."""
    key = _digest(structure, repr(sorted(keep.items())), str(values))
    return _BASELINES.get_or_compute(key, lambda: _run(meta_copy(model, keep)[0], inputs, [], _unthinned(keep), values))


def _unthinned(keep: dict[str, list[int]]) -> Callable[[str], str]:
    """The copy's path -> the model's (`transformer_blocks.1.attn` -> `transformer_blocks.5.attn`)."""

    def path_in_model(path: str) -> str:
        for prefix, indices in keep.items():
            if path.startswith(f"{prefix}."):
                index, _, rest = path[len(prefix) + 1 :].partition(".")
                return f"{prefix}.{indices[int(index)]}" + (f".{rest}" if rest else "")
        return path

    return path_in_model


def representatives(model: nn.Module, resolved: Resolved) -> dict[str, list[int]]:
    """`{ModuleList path: indices}`: of each list a plan glob expands over, the first element of each kind.

    Two elements are of one kind when their modules, parameter shapes and resolved specs (paths
    relative to the element) are the same: then rank 0's forward does the same shapes in both, so
    one of them stands for all (FLUX.2-dev: 1 of 8 double-stream and 1 of 48 single-stream blocks).
    """
    keys = [rule.key for rule in resolved.plan.rules] + list(resolved.plan.attention or ())
    specs = [*resolved.linears, *resolved.norms, *resolved.outputs, *resolved.attention]
    keep = {}
    prefixes = {key.partition(".*")[0] for key in keys if ".*" in key}
    for prefix in sorted(prefixes):
        if any(prefix.startswith(f"{other}.") for other in prefixes):  # a list inside a list: the outer one thins
            continue
        try:
            elements = model.get_submodule(prefix)
        except AttributeError:  # an optional rule's list that this config leaves out (None, or never created)
            continue
        if not isinstance(elements, nn.ModuleList):
            continue
        kinds: dict[str, int] = {}
        for index, element in enumerate(elements):
            kinds.setdefault(_kind(element, f"{prefix}.{index}.", specs), index)
        keep[prefix] = sorted(kinds.values())
    return keep


def _kind(element: nn.Module, prefix: str, specs) -> str:
    modules = [f"{p}:{type(m).__name__}" for p, m in element.named_modules()]
    tensors = [f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in (*element.named_parameters(), *element.named_buffers())]
    planned = [repr(replace(s, path=s.path[len(prefix) :])) for s in specs if s.path.startswith(prefix)]
    return _digest(*modules, *tensors, *planned)


# -- the meta copy ---------------------------------------------------------------------------------


def meta_copy(model: nn.Module, keep: dict[str, list[int]] | None = None) -> tuple[nn.Module, Callable]:
    """A deep copy of `model` on the meta device (same shapes and dtypes), with only the `keep` elements of
    its lists, and the map from a model path to the copy's (None for a path in a dropped element)."""
    keep = keep or {}
    memo: dict[int, object] = {}
    for path, indices in keep.items():
        for index, element in enumerate(model.get_submodule(path)):
            if index not in indices:
                memo[id(element)] = None  # not copied; dropped from the copy's list below
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = nn.Parameter(meta, requires_grad=False) if isinstance(tensor, nn.Parameter) else meta
    clone = copy.deepcopy(model, memo)
    for path, indices in keep.items():
        parent, _, name = path.rpartition(".")
        elements = clone.get_submodule(path)
        setattr(clone.get_submodule(parent), name, nn.ModuleList([elements[i] for i in indices]))
    return clone, lambda path: _thinned_path(path, keep)


def _thinned_path(path: str, keep: dict[str, list[int]]) -> str | None:
    """`transformer_blocks.5.attn` -> `transformer_blocks.1.attn` when 5 is the second element kept; None if dropped."""
    for prefix, indices in keep.items():
        if path.startswith(f"{prefix}."):
            index, _, rest = path[len(prefix) + 1 :].partition(".")
            if int(index) not in indices:
                return None
            return f"{prefix}.{indices.index(int(index))}" + (f".{rest}" if rest else "")
    return path


def shard_meta(clone: nn.Module, resolved: Resolved, tp: int, where: Callable = lambda path: path) -> None:
    """Give `clone` (a meta copy) rank 0's local shapes: what `apply` does to the shapes, nothing else.

    `where` maps a model path to the clone's (None: not in the clone)."""
    for spec in (*resolved.linears, *resolved.norms):
        if where(spec.path) is None:
            continue
        module = clone.get_submodule(where(spec.path))
        for name, layout in spec.param_layouts().items():
            param = getattr(module, name)
            if layout is not None:
                local = torch.empty(layout.local_shape(param.shape, tp), dtype=param.dtype, device="meta")
                module._parameters[name] = nn.Parameter(local, requires_grad=False)
        if isinstance(module, nn.Embedding):  # padding_idx only shapes the gradient; a local table may not hold it
            module.padding_idx = None
        # a gathered output is whole again; an all-reduced one (rowwise, experts) already has its full width locally
        if isinstance(spec, LinearSpec) and spec.style.collective == "all_gather" and not spec.style.is_embedding:
            module.register_forward_hook(_gather_hook(sum(spec.sizes), spec.style.gathered_dim))
        if isinstance(spec, LinearSpec):  # a depthwise conv's groups
            for name, value in spec.style.local_attributes(module, spec, tp).items():
                setattr(module, name, value)
    for spec in resolved.norms:  # runtime/norms.py swaps them for ShardedRMSNorm: local features, local weight
        if where(spec.path) is None:
            continue
        parent, _, name = where(spec.path).rpartition(".")
        norm = clone.get_submodule(where(spec.path))
        setattr(clone.get_submodule(parent), name, _LocalNorm(**{p: getattr(norm, p) for p in spec.param_layouts()}))
    for spec in resolved.outputs:
        if where(spec.path) is not None:
            module = clone.get_submodule(where(spec.path))
            module.register_forward_hook(_cut_hook(spec.dim, tp, spec.path, spec.rule.key))
    for spec in resolved.attention:
        if where(spec.path) is not None:
            module = clone.get_submodule(where(spec.path))
            for attr, value in spec.local_values(tp).items():
                setattr(module, attr, value)


class _LocalNorm(nn.Module):
    """The shapes of `ShardedRMSNorm`: the local features times the local weight (plus bias)."""

    def __init__(self, weight=None, bias=None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.weight is None else x * self.weight
        return y if self.bias is None else y + self.bias


def _gather_hook(width: int, dim: int = -1):
    def hook(module, args, output):
        shape = list(output.shape)
        shape[dim] = width
        return output.new_empty(shape)

    return hook


def _cut_hook(dim: int, tp: int, path: str, key: str):
    def cut(output):
        if isinstance(output, (tuple, list)):
            return type(output)(cut(o) for o in output)
        if not isinstance(output, torch.Tensor):
            return output
        size = output.shape[dim]
        if size % tp:
            raise ValueError(f"shard_output dim {dim} of '{path}' (key '{key}'): size {size} is not divisible by {tp}")
        return output.narrow(dim, 0, size // tp)

    return lambda module, args, output: cut(output)


# -- running it ------------------------------------------------------------------------------------


class _Failure:
    """Where a meta forward raised: the module stack at that moment and the error."""

    def __init__(self, stack: list[str], error: Exception):
        self.stack, self.error = stack, error


@torch.no_grad()
def _run(clone: nn.Module, inputs: dict, trace: list[str], path_in_model: Callable[[str], str], values: bool = False):
    """Output shapes of one forward of `clone`, or a `_Failure`. `trace` collects the modules run, in order,
    by their paths in the model (`path_in_model` maps the thinned copy's paths back). `values`: run with the
    inputs' values known (`meta_values.values_run`)."""
    stack: list[str] = []

    def enter(path: str) -> None:
        stack.append(path)
        trace.append(path)

    def leave() -> None:
        stack.pop()

    for path, module in clone.named_modules():
        model_path = path_in_model(path)
        module.register_forward_pre_hook(lambda m, a, p=model_path: enter(p))
        module.register_forward_hook(lambda m, a, o: leave())
    try:
        with values_run(clone, inputs) if values else strict_index_put():
            output = clone(**inputs)
    except Exception as error:  # any failure of the sharded forward is what we are looking for
        return _Failure(list(stack), error)
    return [tuple(t.shape) for t in tree_leaves(output) if isinstance(t, torch.Tensor)]


def example_inputs(model: nn.Module) -> dict | None:
    """Meta keyword arguments for one forward of `model` (its family's or a registered builder, or token ids for a
    text encoder)."""
    name = type(model).__name__
    builder = _family_inputs if name in FAMILIES else EXAMPLE_INPUTS.get(name)
    if builder is not None:
        try:
            inputs = builder(dict(model.config)) if builder is not _family_inputs else builder(name, dict(model.config))
        except Exception:  # a config the builder does not know: no example, no check
            return None
    elif type(model).__module__.startswith("transformers.") and hasattr(getattr(model, "config", None), "vocab_size"):
        inputs = {"input_ids": torch.ones(1, TEXT_TOKENS, dtype=torch.long)}
    else:
        return None
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def to_meta(x):  # carrying its value, for a forward with data-dependent shapes (`meta_values.py`)
        if not isinstance(x, torch.Tensor):
            return x
        real = x.to(dtype=dtype if x.is_floating_point() else x.dtype)
        return attach(real.to(device="meta"), real)

    return tree_map(to_meta, inputs)


# -- messages --------------------------------------------------------------------------------------


def _blame(specs: dict[str, LinearSpec], stack: list[str], trace: list[str]) -> LinearSpec | None:
    """The planned layer to name: the innermost planned module that failed, else the first colwise layer whose
    shard no rowwise layer consumed yet (`_unconsumed`), else the last sharded one that ran."""
    for path in reversed(stack):
        if path in specs:
            return specs[path]
    open_shards = _unconsumed(specs, trace)
    if open_shards:
        return specs[open_shards[0]]
    sharded = [p for p in trace if p in specs and not specs[p].style.gathers_output]
    return specs[sharded[-1]] if sharded else None


def _unconsumed(specs: dict[str, LinearSpec], trace: list[str]) -> list[str]:
    """Colwise layers that ran, in order, without a rowwise layer after them in their module: a rowwise layer at
    `a.attn.to_out.0` (`a.ff.net.2`) consumes the colwise shards under `a.attn` (`a.ff`), two levels up."""
    open_shards: list[str] = []
    for path in trace:
        spec = specs.get(path)
        if spec is not None and spec.style.role == "colwise" and path not in open_shards:
            open_shards.append(path)
        elif spec is not None and spec.style.role == "rowwise":
            scope = path.rsplit(".", 2)[0] + "." if path.count(".") >= 2 else ""
            open_shards = [p for p in open_shards if not p.startswith(scope)]
    return open_shards


def _crash_message(resolved, specs, tp: int, failure: _Failure, trace, linears: set[str]) -> str:
    where = failure.stack[-1] if failure.stack and failure.stack[-1] else "<model>"
    spec = _blame(specs, failure.stack, trace)
    error = " ".join(str(failure.error).split())[:300]
    missing = _as_key(where, spec) if where in linears and where not in specs else None
    unplanned = f" ('{missing}' is not in the plan: whole on every rank)" if missing else ""
    return (
        f"plan {resolved.plan.name}{_key(spec)}: at tp={tp} the sharded forward fails in '{where}'{unplanned} "
        f"({type(failure.error).__name__}: {error}){_layer(spec)}. Checked on meta tensors with each rank's "
        f"shapes, before sharding: a colwise output must reach a rowwise layer (or attention) of the same block, "
        f"a rowwise layer must be fed a sharded activation, and q, k, v must be split alike."
    )


def _as_key(path: str, spec: LinearSpec | None) -> str | None:
    """`path` written like `spec`'s key when both are in one element of a list: the key it would have."""
    if spec is None or "*" not in spec.rule.key:
        return None
    prefix = spec.rule.key.partition("*")[0]
    index = spec.path[len(prefix) :].partition(".")[0]
    element = f"{prefix}{index}."
    return f"{prefix}*.{path[len(element) :]}" if path.startswith(element) else None


def _shape_message(resolved, specs, tp: int, got, expected, trace) -> str:
    spec = _blame(specs, [], trace)
    return (
        f"plan {resolved.plan.name}{_key(spec)}: at tp={tp} the sharded forward returns shapes {got}, not the "
        f"model's {expected}{_layer(spec)}: a sharded activation reaches the output; pair the colwise layer with "
        f"a rowwise one, or make it colwise_gathered."
    )


def _key(spec: LinearSpec | None) -> str:
    return f", key '{spec.rule.key}'" if spec is not None else ""


def _layer(spec: LinearSpec | None) -> str:
    return f"; the planned layer that fed it: '{spec.path}' ({spec.style.value})" if spec is not None else ""


# -- cache keys ------------------------------------------------------------------------------------


def _structure_digest(model: nn.Module) -> str:
    """The model's class, config, module types, and parameter and buffer names, shapes and dtypes."""
    config = getattr(model, "config", None)
    config = repr(sorted(dict(config).items())) if isinstance(config, dict) else repr(config)
    modules = [f"{p}:{type(m).__name__}" for p, m in model.named_modules()]
    tensors = [f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in (*model.named_parameters(), *model.named_buffers())]
    return _digest(type(model).__module__, type(model).__qualname__, config, *modules, *tensors)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
