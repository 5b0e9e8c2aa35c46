"""Bind a plan's `cp` section to a model and check it together with the TP degree. Mutates nothing.

Checked before anything is hooked: every `cp` key addresses modules; split inputs are forward()
parameters of those modules; every attention module not listed as `local` can be plugged (its
processor calls `dispatch_attention_fn` or `F.scaled_dot_product_attention`, see `attention_routes`);
and, for Ulysses, every attention module's per-rank head count is divisible by cp:
`(heads / tp) % cp == 0` for modules that TP shards, `heads % cp == 0` otherwise.
Sequence lengths are only known at call time: a length cp does not divide is refused then, with
the length and the degree in the message (see `runtime/cp/sequence.py`).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

from torch import nn

from ...errors import PlanError
from ...plan.cp import PAD_AT, GatherRule, PadRule, SplitRule
from ...policy import check_degree, ulysses_degree
from .globs import expand
from .heads import query_heads
from .resolved import Resolved

# diffusers processors compute attention through this name imported into their own module; CP
# replaces it there (runtime/cp/attention.py). Processors that call torch's SDPA directly are routed
# by a TorchFunctionMode scoped to the module's forward (runtime/cp/sdpa.py).
DISPATCH_NAME = "dispatch_attention_fn"
SDPA_NAME = "scaled_dot_product_attention"
# Linear-attention processors with a CP adapter (runtime/cp/linear.py): they have no softmax for Ulysses or ring to
# route; under CP their sums over tokens are all-reduced on the cp group instead, whatever cp_mode says.
LINEAR_ROUTE = "linear"
LINEAR_PROCESSORS = ("SanaLinearAttnProcessor2_0", "SanaLinearAttnProcessor3_0")
# Per-frame cross-attention with a CP adapter (runtime/cp/frames.py): each token attends to its own frame's keys,
# whole on every rank; the adapter finds the frame from the token's global index, so it exchanges nothing.
FRAME_ROUTE = "frames"
FRAME_PROCESSORS = ("WanAnimateFaceBlockAttnProcessor",)
# NABLA block-sparse attention with a CP adapter (runtime/cp/nabla.py): the block mask is built from whole-sequence
# statistics (Ulysses: after the all-to-all; ring: from gathered key-block means); Ulysses' head rule applies.
NABLA_ROUTE = "nabla"
NABLA_PROCESSORS = ("Kandinsky6SRAttnProcessor",)
ADAPTER_ROUTES = (LINEAR_ROUTE, FRAME_ROUTE, NABLA_ROUTE)  # the adapter runs the whole attention: nothing to scope
HEADLESS_ROUTES = (LINEAR_ROUTE, FRAME_ROUTE)  # adapters that split no heads: any cp
# `cp.gathered` kind -> the module classes with a CP forward of that kind (`plan.cp.GATHERED_KINDS`)
GATHERED_CLASSES = {"expert_choice": ("NucleusMoELayer",)}
# Cosmos 3's dual-pathway packed attention (causal text prefix + generation queries over both, GQA) with a CP adapter
# (runtime/cp/packed.py) that runs its own Ulysses / ring exchanges: nothing to scope, but its heads split as usual.
PACKED_ROUTE = "packed"
PACKED_PROCESSORS = ("Cosmos3AttnProcessor",)
# patch embeddings a split's `embed` may name (runtime/cp/grid_embed.py): their forward is `in_layer(x.view(B, F, pt,
# H, ph, W, pw, C).permute(0, 1, 3, 5, 2, 4, 6, 7).flatten(4, 7))` over channels-last latents, `patch_size` (pt, ph, pw)
# (Kandinsky 5 / 6 / 6 SR), or a Conv3d patchifier over channels-first latents (Wan's `patch_embedding`; kernel =
# stride, no padding: `runtime/cp/conv_embed.py`), the only kind an `added` embedding may be
EMBED_CLASSES = ("Kandinsky5VisualEmbeddings", "Kandinsky6VisualEmbeddings", "Kandinsky6SRVisualEmbeddings", "Conv3d")
# `cp.forward` name -> the model class whose forward dtp's copy replaces (`plan.cp.CP_FORWARDS`, runtime/cp/helios.py)
FORWARD_CLASSES = {
    "helios": "HeliosTransformer3DModel",
    "framepack": "HunyuanVideoFramepackTransformer3DModel",
    "cosmos3_omni": "Cosmos3OmniTransformer",
}
# processors whose cross-attention `cp.per_sample` reruns with the context projected once per sample
# (runtime/cp/per_sample.py: that processor's math, without its spatial / group norms, which the adapter refuses)
PER_SAMPLE_PROCESSORS = ("AttnProcessor2_0",)


@dataclass(frozen=True)
class CpAttentionSpec:
    path: str
    heads: int
    tp_sharded: bool  # True: TP leaves heads / tp per rank
    linear: bool = False  # an adapter runs it without a head split (`HEADLESS_ROUTES`: linear attention's all-reduced
    # sums, per-frame attention's local keys): any cp
    packed: bool = False  # Cosmos 3's packed dual-pathway attention (`PACKED_ROUTE`): Ulysses or ring, not both (USP)

    def local_heads(self, tp: int) -> int:
        return self.heads // tp if self.tp_sharded else self.heads


@dataclass(frozen=True)
class CpResolved:
    """The `cp` section bound to one model: hook sites and the attention modules to plug."""

    plan_name: str
    splits: tuple[tuple[str, SplitRule], ...]  # (module path, rule)
    gathers: tuple[tuple[str, GatherRule], ...]
    attention: tuple[CpAttentionSpec, ...]
    padded_attention: tuple[str, ...] = ()  # CP attention paths whose keys hold the padded split's tokens
    ring_refused: str | None = None  # the plan's `ring_refused`: why this model takes Ulysses only
    halos: tuple[tuple[str, int, int], ...] = ()  # (conv path, row dim, halo rows per side): `CpPlan.halo`
    keeps: tuple[tuple[str, object], ...] = ()  # (module path, `plan.cp.KeepRule`): slices by a global count
    gathered: tuple[tuple[str, str], ...] = ()  # (module path, kind): `cp.gathered`, the modules of the kind's class
    grids: tuple[tuple[str, str, object], ...] = ()  # (output layer path, tokens path, `plan.cp.GridRule`): `cp.grid`
    embeds: tuple[tuple[str, str, SplitRule], ...] = ()  # (block path, embedding path, split): `SplitRule.embed`
    forward: object = None  # `plan.cp.ForwardRule`: dtp's forward for the model's class (checked: `_forward`)
    per_sample: tuple[tuple[str, str], ...] = ()  # (attention path, context module path): `cp.per_sample`
    batch_rows: tuple[str, ...] = ()  # module paths: `cp.batch_rows`
    # (attention path, pad slots): the padded attentions whose keys hold some of the plan's padded sequences only
    # (Kandinsky 6: the video ones `first`, the audio ones `last`; `runtime/cp/pad_view.py`); the rest of
    # `padded_attention` see every padded sequence
    pad_slots: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def check(self, tp: int, cp: int, mode: str, ulysses: int | None = None) -> None:
        """Raise PlanError naming the first attention module whose heads block `mode` at (cp, tp).

        ulysses: the Ulysses degree inside cp (USP: ring over cp / ulysses); None: `mode`'s (cp or 1). The heads
        split over the Ulysses degree only, so cp may exceed the head count with ring outside (4 heads, cp=8,
        ulysses=4: ring 2); a model whose plan refuses ring refuses any ring degree above 1."""
        check_degree(cp, f"plan {self.plan_name}: cp")
        ulysses = ulysses_degree(cp, mode, ulysses)
        if cp // ulysses > 1 and self.ring_refused is not None:
            raise PlanError(
                f"plan {self.plan_name}: ring attention cannot run this model: {self.ring_refused} "
                f"Use cp_mode='ulysses' (needs (heads / tp) % cp == 0), or cp=1."
            )
        packed = next((s.path for s in self.attention if s.packed), None)
        if 1 < ulysses < cp and packed is not None:
            raise PlanError(
                f"plan {self.plan_name}: '{packed}' (Cosmos 3's packed attention, runtime/cp/packed.py) runs Ulysses "
                f"or ring over the whole cp axis, not Ulysses x ring; build the mesh without `ulysses=` (--ulysses)."
            )
        if ulysses == 1:
            return
        for spec in (s for s in self.attention if not s.linear):
            local = spec.local_heads(tp)
            if local % ulysses:
                degree = "cp" if ulysses == cp else "ulysses"
                raise PlanError(
                    f"plan {self.plan_name}: Ulysses needs (heads / tp) % {degree} == 0, but '{spec.path}' has "
                    f"{spec.heads} heads, {local} per rank at tp={tp}, and {degree}={ulysses} does not divide "
                    f"{local}. Use cp_mode='ring', a Ulysses degree U dividing {local} with ring over the rest "
                    f"(make_mesh(cp={cp}, ulysses=U), --ulysses U), or cp/tp with ({spec.heads} / tp) % cp == 0."
                )

    def allows(self, tp: int, cp: int, mode: str, ulysses: int | None = None) -> bool:
        try:
            self.check(tp, cp, mode, ulysses)
        except PlanError:
            return False
        return True


def resolve_cp(resolved: Resolved, model: nn.Module) -> CpResolved:
    """Bind `resolved.plan.cp` to `model`; PlanError when the plan has no `cp` section or does not fit."""
    plan = resolved.plan
    if plan.cp is None:
        raise PlanError(
            f"plan {plan.name}: the mesh has a cp axis > 1 but the plan has no `cp` section saying which inputs "
            f"to split along the sequence; add one (see dtp/plan/cp.py) or build the mesh with cp=1."
        )
    if plan.cp.refused is not None:
        raise PlanError(
            f"plan {plan.name}: {type(model).__name__} cannot take context parallelism: {plan.cp.refused} "
            f"Use cp=1 (tensor parallelism only)."
        )
    splits = []
    for rule in plan.cp.splits:
        for path, module in _expand(model, rule.key, plan.name):
            _check_input(plan.name, rule, path, module, model)
            splits.append((path, rule))
    _check_unique(plan.name, splits)
    _check_frames(plan.name, splits)
    gathers = [(path, rule) for rule in plan.cp.gathers for path, _ in _expand(model, rule.key, plan.name)]
    tp_paths = {spec.path for spec in resolved.attention}
    # a `local` glob may cover blocks that lack the attention (None there: FIBO 2.0's cross-attention exists in its
    # injection blocks only); a path wrong in every block is still an error
    local = {path for key in plan.cp.local_attention for path, _ in _expand(model, key, plan.name, optional=True)}
    attention = tuple(
        CpAttentionSpec(path, heads, path in tp_paths, bool(set(HEADLESS_ROUTES) & set(routes)), PACKED_ROUTE in routes)
        for path, module, heads in _attention_modules(plan.name, model)
        if path not in local
        for routes in (attention_routes(module),)
    )
    padded = _padded_attention(plan, model, {spec.path for spec in attention})
    pad_slots = _pad_slots(plan, model)
    halos = tuple(
        _halo(plan.name, rule, path, conv)
        for rule in plan.cp.halo
        for path, conv in _expand(model, rule.key, plan.name)
    )
    keeps = _keeps(plan, model, splits)
    gathered = _gathered(plan, model)
    grids, embeds = _grids(plan, model), _embeds(plan.name, model, splits)
    return CpResolved(
        plan.name, tuple(splits), tuple(gathers), attention, padded, plan.cp.ring_refused, halos, keeps, gathered,
        grids, embeds, _forward(plan, model), _per_sample(plan, model),
        tuple(path for key in plan.cp.batch_rows for path, _ in _expand(model, key, plan.name)), pad_slots,
    )  # fmt: skip


def _forward(plan, model: nn.Module):
    """`cp.forward`: the model is of the class whose forward the named copy replaces (another class's forward would
    run with the wrong body)."""
    rule = plan.cp.forward
    if rule is not None and type(model).__name__ != FORWARD_CLASSES[rule.name]:
        raise PlanError(
            f"plan {plan.name}: cp.forward '{rule.name}' is dtp's forward for {FORWARD_CLASSES[rule.name]}, but the "
            f"model is a {type(model).__name__}; remove `forward` from the plan's cp section or use the class's plan."
        )
    return rule


def _embeds(plan_name: str, model: nn.Module, splits) -> tuple:
    """`(block path, embedding path, rule)` of each split with `embed`: the embedding is one of `EMBED_CLASSES`."""
    embeds = []
    for path, rule in ((p, r) for p, r in splits if r.embed is not None):
        embed = _expand(model, rule.embed, plan_name)[0][1]
        if type(embed).__name__ not in EMBED_CLASSES:
            raise PlanError(
                f"plan {plan_name}, cp split '{rule.key}' '{rule.name}': `embed` '{rule.embed}' is a "
                f"{type(embed).__name__}, not a patch embedding dtp computes per rank ({', '.join(EMBED_CLASSES)})."
            )
        if rule.per_frame is not None:
            _expand(model, rule.per_frame, plan_name)
        convs = [rule.embed] if isinstance(embed, nn.Conv3d) or rule.added is not None else []
        for key in convs + [rule.added] * (rule.added is not None):  # `added` codes are laid out channels-first
            _check_patch_conv(plan_name, rule, key, _expand(model, key, plan_name)[0][1])
        embeds.append((path, rule.embed, rule))
    return tuple(embeds)


def _check_patch_conv(plan_name: str, rule: SplitRule, key: str, module: nn.Module) -> None:
    """A Conv3d `embed`, and any `added` embedding, must patchify: kernel = stride, no padding, dilation 1, groups 1
    (each token the conv of its own patch alone; `runtime/cp/conv_embed.py`)."""
    if isinstance(module, nn.Conv3d):
        patchify = module.stride == module.kernel_size and module.dilation == (1, 1, 1) and module.groups == 1
        if patchify and module.padding in ((0, 0, 0), "valid"):
            return
        kind = f"a Conv3d with kernel {module.kernel_size}, stride {module.stride}, padding {module.padding}"
    else:
        kind = f"a {type(module).__name__}"
    raise PlanError(
        f"plan {plan_name}, cp split '{rule.key}' '{rule.name}': '{key}' is {kind}; a Conv3d `embed`, and any `added` "
        f"embedding (with a Conv3d `embed`), must patchify (kernel = stride, no padding, dilation 1, groups 1) for "
        f"dtp to embed a rank's tokens only; drop `embed` / `added` from the split."
    )


def _per_sample(plan, model: nn.Module) -> tuple[tuple[str, str], ...]:
    """`(attention path, context module path)` of `cp.per_sample`: the context module exists, and each attention
    (where the config has it) runs a processor the adapter copies (`PER_SAMPLE_PROCESSORS`), with no spatial or group
    norm on its queries."""
    sites = []
    for key, context in plan.cp.per_sample:
        _expand(model, context, plan.name)
        # optional, as `cp.local`: a config without the cross-attention (Latte's cross_attention_dim None) has none
        for path, attn in _expand(model, key, plan.name, optional=True):
            processor = type(getattr(attn, "processor", None)).__name__
            norms = [n for n in ("spatial_norm", "group_norm") if getattr(attn, n, None) is not None]
            if processor not in PER_SAMPLE_PROCESSORS or norms:
                raise PlanError(
                    f"plan {plan.name}, cp.per_sample '{key}': '{path}' runs {processor}"
                    f"{' with ' + ', '.join(norms) if norms else ''}; the per-sample adapter copies "
                    f"{', '.join(PER_SAMPLE_PROCESSORS)} without spatial / group norm. Drop the entry (the keys are "
                    f"then projected per frame)."
                )
            sites.append((path, context))
    return tuple(sites)


def _grids(plan, model: nn.Module) -> tuple:
    """`(layer path, tokens path, GridRule)` of `cp.grid`: the layer takes the input; `tokens` (a negative index
    counted from its ModuleList's end) exists."""
    grids = []
    for rule in plan.cp.grid:
        where = f"plan {plan.name}, cp.grid '{rule.key}'"
        path = _last_index(model, rule.key, where)
        module = _expand(model, path, plan.name)[0][1]
        if rule.input not in inspect.signature(module.forward).parameters:
            raise PlanError(f"{where}: '{path}' ({type(module).__name__}) has no forward() input '{rule.input}'.")
        grids.append((path, _last_index(model, rule.tokens, f"{where}, tokens"), rule))
    return tuple(grids)


def _gathered(plan, model: nn.Module) -> tuple[tuple[str, str], ...]:
    """(path, kind) of each module of a `cp.gathered` glob whose class has the kind's CP forward; others of the glob
    (Nucleus-Image's dense MLPs in its first blocks, or in every block with `moe_enabled=False`) run as they are, per
    token. A glob that matches no module at all is an error (`expand`)."""
    found = []
    for key, kind in plan.cp.gathered:
        modules = _expand(model, key, plan.name)
        found += [(path, kind) for path, module in modules if type(module).__name__ in GATHERED_CLASSES[kind]]
    return tuple(found)


def _keeps(plan, model: nn.Module, splits) -> tuple:
    """`(path, KeepRule)` of `cp.keep`: the module takes the input, and `of` / `after` name splits of this plan."""
    ids = {f"{path}.{rule.name}" if path else str(rule.name) for path, rule in splits}
    ids |= {"forward"} if plan.cp.forward is not None else set()  # dtp's forward records its cut as `forward`
    keeps = []
    for rule in plan.cp.keep:
        where = f"plan {plan.name}, cp.keep '{rule.key}'"
        for name in (n for n in (rule.of, rule.after) if n is not None):
            if name not in ids:
                raise PlanError(f"{where}: '{name}' is not a split of this plan; split ids: {', '.join(sorted(ids))}.")
        for path in (p for p in (rule.last, rule.gather) if p is not None):
            _expand(model, path, plan.name)
        path = _last_index(model, rule.key, where)
        module = _expand(model, path, plan.name)[0][1]
        if isinstance(rule.name, str) and rule.name not in inspect.signature(module.forward).parameters:
            raise PlanError(f"{where}: '{path}' ({type(module).__name__}) has no forward() input '{rule.name}'.")
        keeps.append((path, rule))
    return tuple(keeps)


def _last_index(model: nn.Module, key: str, where: str) -> str:
    """`key` with a negative index atom counted from the end of its ModuleList: 'blocks.-1' -> 'blocks.39'."""
    atoms, module = key.split("."), model
    for i, atom in enumerate(atoms):
        if atom.startswith("-") and atom[1:].isdigit() and isinstance(module, nn.ModuleList):
            if int(atom) < -len(module):
                raise PlanError(f"{where}: index {atom} is out of range of a ModuleList of {len(module)}.")
            atoms[i] = atom = str(len(module) + int(atom))
        module = getattr(module, atom, None)
        if module is None:
            raise PlanError(f"{where}: '{'.'.join(atoms[: i + 1])}' does not exist.")
    return ".".join(atoms)


def _halo(plan_name: str, rule, path: str, conv: nn.Module) -> tuple[str, int, int]:
    """(path, dim, rows): a zero-padded stride-1 'same' convolution along input dim `rule.dim` needs `padding` rows
    of each neighbour; any other conv would not map the rank's rows to its own output rows."""
    where = f"plan {plan_name}, cp.halo '{rule.key}': '{path}'"
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) or not 2 <= rule.dim < 2 + len(conv.kernel_size):
        raise PlanError(
            f"{where} ({type(conv).__name__}) must be an nn.Conv1d/2d/3d whose input has the token grid's rows at dim "
            f"{rule.dim} (a spatial dim, 2 for [B, C, H, W])."
        )
    i = rule.dim - 2
    kernel, stride, dilation, padding = conv.kernel_size[i], conv.stride[i], conv.dilation[i], conv.padding
    rows = padding[i] if isinstance(padding, tuple) else None
    if stride != 1 or dilation != 1 or conv.padding_mode != "zeros" or rows is None or 2 * rows != kernel - 1:
        raise PlanError(
            f"{where}: a halo needs a zero-padded, stride-1, undilated 'same' conv along dim {rule.dim}, got kernel "
            f"{kernel}, stride {stride}, dilation {dilation}, padding {padding!r} ({conv.padding_mode}); its output "
            f"rows would not line up with the rank's rows. Remove it from cp.halo or use cp=1."
        )
    return path, rule.dim, rows


def _pad_runs(plan) -> list[tuple[PadRule, tuple[str, ...]]]:
    """Every `pad` rule with the slots it fills: its `at`; both for a `tail` split's and a forward's (two runs)."""
    runs = [(rule.pad, PAD_AT if rule.tail is not None else (rule.pad.at,)) for rule in plan.cp.splits if rule.pad]
    forward = plan.cp.forward
    return runs + ([(forward.pad, PAD_AT)] if forward is not None and forward.pad is not None else [])


def _pad_slots(plan, model: nn.Module) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(path, slots) for each padded attention that sees fewer padded slots than the plan fills (`pad_view.py`)."""
    runs = _pad_runs(plan)
    filled = {at for _, slots in runs for at in slots}
    seen: dict[str, set[str]] = {}
    for pad, slots in runs:
        for key in pad.attention:
            for path, _ in _expand(model, key, plan.name):
                seen.setdefault(path, set()).update(slots)
    return tuple((path, tuple(at for at in PAD_AT if at in s)) for path, s in seen.items() if s != filled)


def _padded_attention(plan, model: nn.Module, cp_paths: set[str]) -> tuple[str, ...]:
    """The attention paths named by the padded splits' `pad.attention`; each must run CP attention."""
    keys = dict.fromkeys(key for pad, _ in _pad_runs(plan) for key in pad.attention)
    paths = list(dict.fromkeys(path for key in keys for path, _ in _expand(model, key, plan.name)))
    for path in paths:
        if path not in cp_paths:
            raise PlanError(
                f"plan {plan.name}: pad.attention names '{path}', which is not a CP attention module (it is "
                f"`local` or has no processor); its keys would not be masked."
            )
    return tuple(paths)


def _expand(model: nn.Module, key: str, plan_name: str, optional: bool = False):
    return [("", model)] if key == "" else expand(model, key, plan_name, optional=optional)


def _check_input(plan_name: str, rule: SplitRule, path: str, module: nn.Module, model: nn.Module) -> None:
    """An input split must name a forward() parameter (outputs are checked when the module returns); a `frames_of`
    split, a parameter of the model's forward; a `skip` split, one of the module's."""
    if rule.output and rule.frames_of is not None:
        module, path, names = model, "", (rule.frames_of,)
    elif rule.output and rule.skip is not None:
        names = (rule.skip,)
    elif rule.output:
        return
    else:
        names = (rule.name, *rule.segments, *((rule.tail,) if rule.tail else ()))
    params = inspect.signature(module.forward).parameters
    for name in names:
        if name not in params:
            raise PlanError(
                f"plan {plan_name}, cp key '{rule.key}': '{path or '<model>'}' ({type(module).__name__}) has no "
                f"forward() parameter '{name}'; parameters: {', '.join(params)}."
            )


def _check_frames(plan_name: str, splits) -> None:
    """A `frames_of` or `skip` split is the only split of its module's output (it reshapes the whole output)."""
    outputs = {}
    for path, rule in splits:
        if rule.output:
            outputs.setdefault(path, []).append(rule)
    for path, rules in outputs.items():
        if len(rules) > 1 and any(rule.frames_of is not None or rule.skip is not None for rule in rules):
            raise PlanError(
                f"plan {plan_name}: '{path}' has a `frames_of` / `skip` output split and {len(rules) - 1} other "
                f"output split(s); such a split cuts the module's one output alone."
            )


def _check_unique(plan_name: str, splits) -> None:
    seen = {}
    for path, rule in splits:
        ident = (path, rule.name, rule.output, rule.element)
        if ident in seen:
            raise PlanError(
                f"plan {plan_name}: '{rule.name}' of '{path or '<model>'}' is split by both cp keys "
                f"'{seen[ident]}' and '{rule.key}'; it would be cut twice."
            )
        seen[ident] = rule.key


def _attention_modules(plan_name: str, model: nn.Module) -> list[tuple[str, nn.Module, int]]:
    """(path, module, query heads) of every module with a diffusers processor; each must be pluggable, or its
    attention would stay local."""
    found = []
    for path, module in model.named_modules():
        if getattr(module, "processor", None) is None:
            continue
        if not attention_routes(module):
            raise PlanError(
                f"plan {plan_name}: attention '{path}' uses {type(module.processor).__name__}, which calls neither "
                f"dispatch_attention_fn nor F.scaled_dot_product_attention; dtp context parallelism cannot plug into "
                f"it (its attention would see only local tokens). Set a processor that does, or use cp=1."
            )
        heads = query_heads(module)
        if heads is None:
            raise PlanError(f"plan {plan_name}: attention '{path}' has no integer `heads`; cannot check cp.")
        found.append((path, module, heads))
    if not found:
        raise PlanError(
            f"plan {plan_name}: {type(model).__name__} has no attention module with a processor; "
            f"nothing for context parallelism to plug into."
        )
    return found


def processor_module(attn: nn.Module):
    """The Python module of `attn`'s processor if it calls `dispatch_attention_fn`, else None."""
    processor = getattr(attn, "processor", None)
    module = sys.modules.get(type(processor).__module__) if processor is not None else None
    return module if module is not None and callable(getattr(module, DISPATCH_NAME, None)) else None


def attention_routes(attn: nn.Module) -> tuple[str, ...]:
    """How CP can reach `attn`'s attention: `"dispatch"` and/or `"sdpa"`, from the names its processor's
    `__call__` uses (nested functions included); `("linear",)` for a linear-attention processor with a CP adapter
    (`LINEAR_PROCESSORS`); empty when it calls neither (e.g. a processor with its own attention math)."""
    processor = getattr(attn, "processor", None)
    if type(processor).__name__ in LINEAR_PROCESSORS:
        return (LINEAR_ROUTE,)
    if type(processor).__name__ in FRAME_PROCESSORS:
        return (FRAME_ROUTE,)
    if type(processor).__name__ in NABLA_PROCESSORS:
        return (NABLA_ROUTE,)
    if type(processor).__name__ in PACKED_PROCESSORS:
        return (PACKED_ROUTE,)
    names = _code_names(type(processor).__call__.__code__) if processor is not None else set()
    routes = []
    if DISPATCH_NAME in names and processor_module(attn) is not None:
        routes.append("dispatch")
    if SDPA_NAME in names:
        routes.append("sdpa")
    return tuple(routes)


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names
