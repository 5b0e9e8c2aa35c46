"""Ranks agree before anything is sharded: one fingerprint exchange over the mesh, a PlanError on a mismatch.

Under torchrun every rank builds its own model and plan. When they differ (a stale plan file on one
node, another diffusers release, one rank in bf16) the ranks issue different collectives, and the
forward hangs (NCCL: until its watchdog) or crashes somewhere unrelated ("Connection reset by peer").
So `engine.prepare` ends with `check_agree(mesh, fingerprint(...))`:

    every rank: items = [(label, value), ...]      what must agree, in the order a difference is reported
                digest = sha256(items)              32 bytes
    all_gather(digest) over the mesh                the only collective when the ranks agree
    digests differ -> all_gather_object(items)      only then, the details
                   -> every rank raises the same PlanError naming the ranks and the first difference

Example: rank 1 built one more double block than rank 0. The item `module list 'transformer_blocks'`
is "2 elements" on rank 0 and "3 elements" on rank 1, and both ranks raise::

    PlanError: ranks disagree on what to shard (49 differences); first: module list 'transformer_blocks'
    is 2 elements on ranks [0], 3 elements on ranks [1].
      also: parameter dtypes is float32 x 108 on ranks [0], float32 x 140 on ranks [1]
      also: linear 'transformer_blocks.2.attn.to_q' is absent on ranks [0], colwise sizes [64] bias True on ranks [1]
      ...

A rank whose own checks failed takes part with the single item `checks = failed: <its error>`, so its
peers raise with it instead of waiting in the exchange for a rank that will never come.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from functools import cache
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .. import quant
from ..errors import PlanError
from .placement import local_device

CHECKS_LABEL = "checks"  # first item: "passed", or "failed: <error>" on a rank whose own checks raised
MAX_LISTED = 3  # differences spelled out in the message after the first

Items = list[tuple[str, str]]


# ---- what must agree ----------------------------------------------------------------------------


def fingerprint(model: nn.Module, resolved, cp_resolved, mesh, options: dict) -> Items:
    """Everything two ranks must share to issue the same collectives, as ordered (label, value) items.

    Ordered from the most telling difference to the least: software, mesh and options, the model's
    class and structure, the dtypes, the resolved plan, then every parameter. `options` are the
    engine's keyword options that change what is sharded (e.g. `{"cp_mode": "ulysses"}`); plan
    names and file paths are left out on purpose (two nodes may keep the same plan in other folders).
    """
    items: Items = [(CHECKS_LABEL, "passed"), *software(model), *mesh_items(mesh)]
    items += [(f"option {name}", str(value)) for name, value in options.items()]
    items.append(("model class", f"{type(model).__module__}.{type(model).__qualname__}"))
    items += module_lists(model)
    items.append(("parameter dtypes", dtype_counts(model)))
    items.append(("quantized weights", quantized_counts(model)))
    items += plan_items(resolved, cp_resolved)
    items += adapter_items(model)
    items += [(f"parameter '{name}'", _parameter(p)) for name, p in model.named_parameters()]
    return items


def failed(error: BaseException) -> Items:
    """The fingerprint of a rank whose own checks raised `error`."""
    return [(CHECKS_LABEL, f"failed: {type(error).__name__}: {error}")]


def software(model: nn.Module) -> Items:
    """dtp (version and a digest of its source files), torch, and the library the model's class comes from."""
    library = type(model).__module__.split(".")[0]
    return [
        ("dtp version", f"{_version('dtp')}, source {source_digest()}"),
        ("torch version", torch.__version__),
        (f"{library} version", _version(library)),
    ]


@cache
def source_digest() -> str:
    """sha256 (12 hex digits) of every .py file of the dtp package: catches a stale copy on one node."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def mesh_items(mesh) -> Items:
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    shape = " x ".join(f"{name}={size}" for name, size in zip(names, mesh.shape))
    return [("mesh", f"{mesh.device_type}, {shape}")]


def module_lists(model: nn.Module) -> Items:
    """The length of every outermost ModuleList: one more block on one rank shows here first.

    Lists inside a block (e.g. `attn.to_out`) are left to the parameter items: one extra block would
    otherwise repeat as one difference per list it holds.
    """
    outer: list[str] = []
    for name, module in model.named_modules():  # pre-order: an enclosing list comes first
        if isinstance(module, nn.ModuleList) and not any(name.startswith(f"{o}.") for o in outer):
            outer.append(name)
    return [(f"module list '{name}'", f"{len(model.get_submodule(name))} elements") for name in outer]


def dtype_counts(model: nn.Module) -> str:
    """e.g. "float32 x 120" or "bfloat16 x 118, float32 x 2": parameters per dtype."""
    counts: dict[str, int] = {}
    for param in model.parameters():
        counts[_dtype(param)] = counts.get(_dtype(param), 0) + 1
    return ", ".join(f"{dtype} x {n}" for dtype, n in sorted(counts.items())) or "no parameters"


def quantized_counts(model: nn.Module) -> str:
    """e.g. "int8wo x 42" or "none": torchao-quantized parameters per scheme (a quantized weight keeps the
    compute dtype as its dtype, so the dtypes alone would not tell ranks quantized differently apart)."""
    counts: dict[str, int] = {}
    for param in model.parameters():
        kind = quant.describe(param)
        if kind is not None:
            counts[kind.scheme] = counts.get(kind.scheme, 0) + 1
    return ", ".join(f"{scheme} x {n}" for scheme, n in sorted(counts.items())) or "none"


def _parameter(param: torch.Tensor) -> str:
    """dtype and shape, and the quantization (scheme, torchao class, scale granularity) where there is one."""
    kind = quant.describe(param)
    text = f"{_dtype(param)} {list(param.shape)}"
    return text if kind is None else f"{text} {kind.scheme} ({kind.cls}, {kind.granularity})"


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def plan_items(resolved, cp_resolved) -> Items:
    """The resolved plan: its rules, then what they bound to (Linears, attention modules, cp sites)."""
    plan = resolved.plan
    items = [(f"key '{rule.key}'", _rule(rule)) for rule in plan.rules]
    items.append(("attention globs", "inferred" if plan.attention is None else ", ".join(plan.attention)))
    items += [
        (f"linear '{s.path}'", f"{_rule(s.rule)} sizes {list(s.sizes)} bias {s.has_bias}") for s in resolved.linears
    ]
    items += [(f"attention '{s.path}'", ", ".join(f"{a}={v}" for a, v in s.values)) for s in resolved.attention]
    if cp_resolved is not None:
        items += [(f"cp split '{path}' {rule.name!r}[{rule.element}]", repr(rule)) for path, rule in cp_resolved.splits]
        items += [(f"cp gather '{path}'", repr(rule)) for path, rule in cp_resolved.gathers]
        items += [
            (f"cp attention '{s.path}'", f"heads={s.heads} tp_sharded={s.tp_sharded}") for s in cp_resolved.attention
        ]
        items += [(f"cp halo '{path}'", f"dim={dim} rows={rows}") for path, dim, rows in cp_resolved.halos]
        items += [(f"cp keep '{path}' {rule.name!r}", repr(rule)) for path, rule in cp_resolved.keeps]
        items += [(f"cp grid '{path}' from '{tokens}'", repr(rule)) for path, tokens, rule in cp_resolved.grids]
        items += [(f"cp embed '{embed}' at '{path}'", repr(rule)) for path, embed, rule in cp_resolved.embeds]
        items += [("cp forward", repr(cp_resolved.forward))] if cp_resolved.forward is not None else []
        items += [(f"cp per_sample '{path}'", f"context {context}") for path, context in cp_resolved.per_sample]
        items += [(f"cp batch_rows '{path}'", "rows split, gathered") for path in cp_resolved.batch_rows]
    return items


def _rule(rule) -> str:
    return rule.style.value + ("" if rule.blocks is None else f" blocks {list(rule.blocks)}")


def adapter_items(model: nn.Module) -> Items:
    """peft adapters loaded on the model (diffusers' `peft_config`): name -> their config."""
    configs = getattr(model, "peft_config", None) or {}
    return [(f"adapter '{name}'", _config_text(config)) for name, config in sorted(configs.items())]


def _config_text(config) -> str:
    data = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    return json.dumps(data, sort_keys=True, default=lambda v: sorted(map(str, v)) if isinstance(v, set) else str(v))


# ---- the exchange -------------------------------------------------------------------------------


def check_agree(mesh, items: Items) -> None:
    """Exchange `items`' digest over `mesh`; PlanError on every rank when any two ranks differ.

    Costs one all_gather of 32 bytes per group (one group for the meshes `make_mesh` builds),
    plus an all_gather_object of the items only when the digests differ.
    """
    digest = _digest(items)
    for group in agreement_groups(mesh):
        _exchange(group, items, digest, local_device(mesh.device_type))


def agreement_groups(mesh) -> list:
    """The process groups that together span `mesh`; none where there is nothing to compare.

    Skipped: a mesh of one rank (nobody to disagree with), and torch's fake process group
    (`dtp check`): its collectives return without communicating, so there are no peers' digests to
    read, and its one real process cannot disagree with ranks that do not exist.
    """
    if mesh.size() == 1 or dist.get_backend(mesh.get_group(0)) == "fake":
        return []
    if mesh.ndim == 1:
        return [mesh.get_group()]
    if mesh.size() == dist.get_world_size():
        return [dist.group.WORLD]  # a make_mesh mesh spans the world: one collective for both axes
    # A multi-axis mesh over part of the world: agreement along every axis is agreement on the grid.
    return [mesh.get_group(axis) for axis in range(mesh.ndim) if mesh.size(axis) > 1]


def _digest(items: Items) -> bytes:
    return hashlib.sha256(json.dumps(items).encode()).digest()


def _exchange(group, items: Items, digest: bytes, device: torch.device) -> None:
    local = torch.tensor(list(digest), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    if all(torch.equal(g, gathered[0]) for g in gathered[1:]):
        return
    details: list = [None] * len(gathered)
    dist.all_gather_object(details, items, group=group)
    message = describe(dict(zip(dist.get_process_group_ranks(group), details)))
    assert message is not None, "digests differ but the items are equal"
    raise PlanError(message)


# ---- the message --------------------------------------------------------------------------------


def differences(by_rank: dict[int, Items]) -> list[tuple[str, dict[str, list[int]]]]:
    """Every label whose value is not the same on all ranks, in first-seen order (ranks in order):
    `[(label, {value: [ranks]}), ...]`; a label a rank lacks has the value "absent" there."""
    values = {rank: dict(items) for rank, items in by_rank.items()}
    labels = dict.fromkeys(label for rank in sorted(by_rank) for label, _ in by_rank[rank])
    found = []
    for label in labels:
        groups: dict[str, list[int]] = {}
        for rank in sorted(values):
            groups.setdefault(values[rank].get(label, "absent"), []).append(rank)
        if len(groups) > 1:
            found.append((label, groups))
    return found


def describe(by_rank: dict[int, Items]) -> str | None:
    """The PlanError message for items that differ between ranks, or None when they all agree."""
    found = differences(by_rank)
    if not found:
        return None
    if found[0][0] == CHECKS_LABEL:
        return _failed_checks(found[0][1])
    lines = [_difference(label, groups) for label, groups in found[: 1 + MAX_LISTED]]
    more = f" (and {len(found) - len(lines)} more)" if len(found) > len(lines) else ""
    return (
        f"ranks disagree on what to shard ({len(found)} difference{'s' * (len(found) > 1)}); first: {lines[0]}."
        + "".join(f"\n  also: {line}" for line in lines[1:])
        + more
        + "\nEvery rank must build the same model (class, config, dtype, adapters) and pass the same plan and "
        "options, with the same dtp, torch and model library; otherwise the ranks would issue different "
        "collectives and hang or crash in the forward. Nothing was sharded."
    )


def _failed_checks(groups: dict[str, list[int]]) -> str:
    """Some ranks' own checks raised: say which, with each distinct error (a rank cannot go on alone)."""
    passed = groups.pop("passed", [])
    errors = "".join(f"\n  on ranks {ranks}: {value.removeprefix('failed: ')}" for value, ranks in groups.items())
    failing = sorted(rank for ranks in groups.values() for rank in ranks)
    if passed:
        head = f"ranks {failing} failed the checks that ranks {passed} passed, so no rank shards anything:"
    else:
        head = "every rank failed its checks, with different errors:"
    return head + errors


def _difference(label: str, groups: dict[str, list[int]]) -> str:
    return f"{label} is " + ", ".join(f"{value} on ranks {ranks}" for value, ranks in groups.items())
