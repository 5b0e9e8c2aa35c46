"""What `dtp check` measures: a plan at full size, without GPUs or memory (the CLI: `dtp/tools/check.py`).

Builds the model at full size on the meta device, joins torch's fake process group of `cp * tp`
ranks (see `fakepg.py`), resolves and applies the plan exactly as `parallelize` does on rank 0, and
reports what one rank would hold and send:

    total        = sum of every parameter's bytes
    per rank     = sum of this rank's local shards (replicated parameters whole)
    ideal        = total / tp            (the physical limit: nothing replicated)
    ratio        = per rank / ideal      (1.00 is perfect; diffusers' FLUX.1-dev plan: 2.93 at tp 8)

and, from ONE traced forward of the sharded model (`forward.trace_sharded`: fake tensors, the cp hooks as
`parallelize` installs them; one block per list where the blocks of every list are alike, its records repeated for
the others, `trace.expand_blocks`, else whole depth) at the family's full-size input (`inputs.forward_inputs`: a
1024^2 image, a video model's usual clip), the collectives of one denoising step without CFG (true CFG runs two)
and, with `peak`, the activation peak next to one rank's. Weights are replicated along `cp`, so the memory figures do
not depend on `cp` (with `dtp check --fsdp`, FSDP2 divides them over cfg x cp too: `fsdp.py`); `measured` lists
the tensor-parallel collectives, `cp_measured` the context-parallel ones (each rank's share of the sequence).

With `kernels` (`dtp check --kernels`) that one forward runs on fake CUDA tensors instead (`trace.py`, `cuda.py`), so
the collectives, the peak and the `kernels` section (`kernels.py`: attention kernel of each call, matmul dtypes,
collectives and host syncs per block) describe the code a GPU runs, under `attention_backend` when given.

`dtp check flux-pipeline --tp N` (every pipeline of `families/released_pipelines.py`: also flux2-pipeline,
qwenimage-pipeline, wan-pipeline, wan-vace-pipeline, ltx2-pipeline, flux3-pipeline):
every component of a released pipeline as `dtp.parallelize_pipeline` shards it, its plan or whole with
the reason, and the same figures for the pipeline (total, per rank, ideal = total / tp, ratio). Memory
only: no forward, no collectives.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from ..choices import DEFAULT_TEXT_TOKENS
from ..engine import apply, prepare, supported_tp
from ..errors import ForwardError, PlanError
from ..families import FAMILIES
from ..pipeline import WHOLE, parallelize_pipeline
from ..plan import Plan, bundled_plan_names, load_plan
from ..policy import check_degree, parse_dtype
from ..quant import config_for, quantize
from ..resolve import Resolved
from ..resolve.transforms.padding import overhead
from ..runtime.cfg.cost import exchange_per_step
from ..runtime.memory import local_param_bytes, local_tensor_bytes
from ..runtime.mesh import make_mesh
from .collectives import implied_collectives
from .fakepg import default_config, fake_mesh, fake_world, meta_model, read_config
from .forward import (
    INDEXED_LISTS,
    Call,
    alike_blocks,
    hooks_alike,
    peak_report,
    trace_peak,
    trace_sharded,
)
from .fsdp import fsdp_bytes
from .inputs import ForwardShape, FullInputs, forward_inputs
from .kernels import attention_backend, kernels_report
from .lint import lint_report
from .released import RELEASED_PIPELINES, build_pipeline, released_pipeline
from .trace import Trace, expand_blocks, truncate_blocks

TOP_REPLICATED = 6
PIPELINE_SUFFIX = "-pipeline"  # `dtp check flux-pipeline`: a released pipeline, every component
TEXT_ENCODER_PREFIX = "text_encoder"  # diffusers' component names: text_encoder, text_encoder_2, ...


def check(
    target: str,
    *,
    tp: int,
    cp: int = 1,
    cp_mode: str = "ulysses",
    plan: str | None = None,
    config: str | None = None,
    dtype: str = "bf16",
    resolution: int | None = None,
    frames: int | None = None,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    forward: bool = True,
    pad: bool = False,
    quant: str | None = None,
    cfg: int = 1,
    peak: bool = False,
    kernels: bool = False,
    attention: str | None = None,
    ulysses: int | None = None,
) -> dict:
    """The `dtp check` report as a dict; PlanError on a bad target, config, degree or plan. `cfg` > 1 adds the cfg
    exchange (`add_cfg`); `peak` (with `forward`) the activation peak at (cp, tp) from the same trace as the
    collectives, next to one rank's (`forward.peak_report`); `kernels` traces on fake CUDA tensors and adds what the
    GPU runs (`kernels.kernels_report`), under the attention backend `attention` (None: auto). `ulysses`: USP's Ulysses
    degree inside cp (`make_mesh(cp=C, ulysses=U)`; None: cp_mode's)."""
    _check_degrees(tp, cp)
    class_name, the_plan = _target(target, plan)
    device = "cuda" if kernels else "cpu"
    options = dict(tp=tp, cp=cp, cp_mode=cp_mode, dtype=dtype, pad=pad, quant=quant, forward=forward, device=device)
    options["ulysses"] = ulysses
    model_config = read_config(config) if config else None
    shape = ForwardShape(resolution=resolution, frames=frames, text_tokens=text_tokens)
    with attention_backend(attention, device):
        report, traced = _measure(class_name, the_plan, config=model_config, shape=shape, **options)
        if peak and forward:
            report["activation_peak"] = _peak(class_name, the_plan, traced, model_config, shape, options)
    report["config"] = config or report["config"]
    report["lint"] = lint_report(class_name, the_plan)
    add_cfg(report, cfg)
    if kernels:
        report["kernels"] = _kernels(traced, attention)
    if kernels or attention:
        report["attention_backend"] = attention or "auto"
    return report


def _kernels(traced, attention: str | None) -> dict:
    if not isinstance(traced.trace, Trace):  # no forward, or it could not run on fake CUDA tensors
        why = "--no-forward" if traced.trace is None else f"{type(traced.trace).__name__}: {traced.trace}"
        return {"error": f"no traced forward ({why})"}
    return kernels_report(traced.trace, attention)


def measure(
    class_name: str,
    plan: Plan | None,
    *,
    tp: int,
    cp: int = 1,
    cp_mode: str = "ulysses",
    config: dict | None = None,
    dtype: str = "bf16",
    resolution: int | None = None,
    frames: int | None = None,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    forward: bool = True,
    pad: bool = False,
    quant: str | None = None,
) -> dict:
    """Build `class_name` on meta, shard it with `plan` (None: `plan_for`) on rank 0 of a fake world.

    `forward=False` skips the traced forward (and the measured collectives), for callers after memory only.
    `pad=True` zero-pads heads and widths tp does not divide; `report["padding"]` says what that costs
    (`padding.overhead`); `total_bytes` and `ideal_bytes` stay the unpadded model's.
    `quant` (a `dtp.quant.SCHEMES` name): every Linear quantized by torchao first (on meta), so every byte
    figure is the quantized one (data + scales).
    """
    shape = ForwardShape(resolution=resolution, frames=frames, text_tokens=text_tokens)
    options = dict(tp=tp, cp=cp, cp_mode=cp_mode, dtype=dtype, pad=pad, quant=quant, forward=forward)
    return _measure(class_name, plan, config=config, shape=shape, device="cpu", **options)[0]


@dataclass(frozen=True)
class _Traced:
    """The one forward `dtp check` traced: its trace (or why it could not run) and its inputs."""

    trace: Trace | Exception | None
    inputs: FullInputs | None


def _measure(
    class_name, plan, *, config, shape, tp, cp, cp_mode, dtype, pad, quant, forward, device, ulysses=None
) -> tuple[dict, _Traced]:
    """(report, the traced forward): the layout figures while sharding, then one whole-depth trace (collectives,
    activation peak, output bytes) of the sharded model with its cp hooks, as `parallelize` leaves it, on fake
    `device` tensors."""
    model = meta_model(class_name, config, parse_dtype(dtype))
    quantized = None
    if quant is not None:
        quantized = quantize(copy.deepcopy(model), config_for(quant))
    inputs = None
    if forward and class_name in FAMILIES:
        inputs = forward_inputs(class_name, dict(model.config), parse_dtype(dtype), shape)
    layout = dict(class_name=class_name, config=config, dtype=dtype, tp=tp, cp=cp, cp_mode=cp_mode, pad=pad)
    layout["ulysses"] = ulysses
    shard = _CheckShard(plan, layout, quant, quantized, device)
    calls = {"forward": Call(inputs.kwargs)} if inputs is not None else {}
    traces, _ = trace_sharded(model, tp * cp, shard, calls, catch=(Exception,), device=device)
    if isinstance(traces.get("forward"), Trace) and shard.lengths:
        traces["forward"] = expand_blocks(traces["forward"], shard.lengths)
    report = shard.report
    if forward:
        report["collectives"] = _collectives(shard.implied, traces.get("forward"), inputs, class_name, shard.cp_group)
    report["ratio"] = report["per_rank_bytes"] / (report["total_bytes"] / tp)
    return report, _Traced(traces.get("forward"), inputs)


class _CheckShard:
    """`dtp check`'s shard step (inside the fake world): prepare + apply as `parallelize` does, the layout figures
    taken on the way. With `quant` they are taken on the quantized twin (every byte figure the quantized one) and the
    traced model is sharded alike unquantized: torchao's tensors cannot be made fake, and a weight-only scheme
    changes no activation and no collective."""

    def __init__(self, plan, layout: dict, quant: str | None, quantized, device: str = "cpu"):
        self.plan, self.layout, self.quant, self.quantized, self.device = plan, layout, quant, quantized, device
        self.report: dict = {}
        self.implied: dict = {}
        self.cp_group: str | None = None
        self.lengths: dict = {}

    def __call__(self, module) -> None:
        tp, cp, cp_mode, pad, ulysses = (self.layout[k] for k in ("tp", "cp", "cp_mode", "pad", "ulysses"))
        mesh = fake_mesh(tp=tp, cp=cp, device=self.device, ulysses=ulysses)
        measured = module if self.quantized is None else self.quantized
        prepared = prepare(measured, mesh, self.plan, cp_mode=cp_mode, pad=pad)
        self.report = _prepared_report(measured, prepared, quant=self.quant, **self.layout)
        apply(measured, prepared)
        self.report["per_rank_bytes"] = local_param_bytes(measured)
        # at tp=1 no style issues a collective (the plan's Linears stay whole), whatever the plan says at tp > 1
        self.implied = implied_collectives(prepared.resolved, measured) if tp > 1 else {}
        if measured is not module:
            apply(module, prepare(module, mesh, self.plan, cp_mode=cp_mode, pad=pad))
        self.cp_group = mesh.get_group("cp").group_name if cp > 1 else None
        # Alike blocks: trace one per list and repeat its records (`trace.expand_blocks`; FLUX.1-dev: 2 blocks of 57).
        # Hooks on a later block (a gather at `blocks.-1`: Kandinsky 5 / 6) would be cut away with it: traced whole
        # then (`hooks_alike`).
        alike = alike_blocks(module) and hooks_alike(module)
        self.lengths = truncate_blocks(module, keep=1, skip=INDEXED_LISTS) if alike else {}


def _prepared_report(model, prepared, *, class_name, config, dtype, tp, cp, cp_mode, pad, quant, ulysses) -> dict:
    """The layout figures of `prepared` on the unsharded `model`: what a rank holds, what stays whole, padding."""
    unpadded = prepared.padding.unpadded if prepared.padding is not None else prepared.resolved
    report = _layout_report(model, unpadded, class_name, config, dtype, tp, cp, cp_mode, pad, ulysses)
    if cp > 1:
        report["ulysses"], report["ring"] = prepared.parallelism.ulysses, prepared.parallelism.ring
    report["quant"] = quant
    report["padding"] = overhead(prepared.padding, model) if prepared.padding is not None else None
    return report


def _peak(class_name, plan, traced: _Traced, config, shape, options) -> dict:
    """The activation-peak section: (cp, tp) from `dtp check`'s own trace (the whole model), one rank's from a trace
    of its own: cut to one block per list where the blocks are alike (`forward.alike_blocks`: the same peak, 1/19 of
    FLUX.1-dev's trace), whole otherwise (a cut one misses the peak of a block unlike the first: SD3's context-only
    last block)."""
    if isinstance(traced.trace, Exception):  # e.g. cp does not divide this sequence: the rest of the report stands
        return {"error": str(traced.trace)}
    degrees = {k: options[k] for k in ("cp", "tp", "cp_mode", "pad")}
    sharded = trace_peak(traced.trace, traced.inputs)
    try:
        common = dict(shape=shape, dtype=parse_dtype(options["dtype"]), config=config, device=options["device"])
        return peak_report(class_name, plan, **degrees, sharded=sharded, cut=None, **common)
    except ForwardError as exc:
        return {"error": str(exc)}


def _layout_report(model, resolved: Resolved, class_name, config, dtype, tp, cp, cp_mode, pad, ulysses=None) -> dict:
    total = local_param_bytes(model)  # the model is not sharded yet: every parameter whole (quantized: data + scales)
    return {
        "model": class_name,
        "plan": resolved.plan.name,
        "config": "given" if config is not None else _default_label(class_name),
        "dtype": dtype,
        "tp": tp,
        "cp": cp,
        "world_size": tp * cp,
        "params": sum(p.numel() for p in model.parameters()),
        "total_bytes": total,
        "ideal_bytes": total // tp,
        "cp_mode": cp_mode if cp > 1 else None,
        "pad": pad,
        "candidates": supported_tp(model, resolved, cp, cp_mode, pad=pad, ulysses=ulysses),
        "replicated": replicated_modules(model, resolved)[:TOP_REPLICATED],
    }


def check_fsdp(target: str, *, plan: str | None = None, config: str | None = None, **degrees) -> dict:
    """`dtp check --fsdp`'s traced figures (`fsdp.fsdp_bytes`) of a target as `check` takes it (a bundled plan name,
    a plan file, or a class name with `plan`), `config` a diffusers config.json path or None (the released one)."""
    class_name, the_plan = _target(target, plan)
    return fsdp_bytes(class_name, the_plan, config=read_config(config) if config else None, **degrees)


def _default_label(class_name: str) -> str:
    overrides = default_config(class_name)
    return f"class defaults + {json.dumps(overrides)}" if overrides else "class defaults"


def _check_degrees(tp, cp) -> None:
    for name, value in (("tp", tp), ("cp", cp)):
        check_degree(value, f"dtp check: --{name}")


def _target(target: str, plan: str | None) -> tuple[str, Plan | None]:
    """(class name, plan or None for `plan_for`) from a bundled plan name, a YAML path or a class name."""
    if target in bundled_plan_names() or target.endswith((".yaml", ".yml")) or Path(target).is_file():
        if plan is not None:
            raise PlanError(f"dtp check: '{target}' is a plan already; --plan applies to a class name only.")
        the_plan = load_plan(target)
        if not the_plan.models:
            raise PlanError(f"plan {the_plan.name} lists no `models`; run `dtp check CLASS --plan {target}`.")
        return the_plan.models[0], the_plan
    import diffusers

    cls = getattr(diffusers, target, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise PlanError(
            f"dtp check: '{target}' is neither a bundled plan ({', '.join(bundled_plan_names())}), a plan file, "
            f"a diffusers model class (e.g. FluxTransformer2DModel), nor a released pipeline "
            f"({', '.join(RELEASED_PIPELINES)})."
        )
    return target, load_plan(plan) if plan else None


def replicated_modules(model: torch.nn.Module, resolved: Resolved) -> list[dict]:
    """Every rank's whole-held parameters, by module with block indices folded to `*`, largest first.

    A parameter that a container holds itself (Wan's `blocks.0.scale_shift_table`) is listed by its own
    name: the block's path alone would read as if the whole block were replicated.
    """
    layouts = resolved.param_layouts()
    containers = {name for name, module in model.named_modules() if next(module.children(), None) is not None}
    bytes_by, paths_by = Counter(), {}
    for name, param in model.named_parameters():
        if layouts.get(name) is not None:
            continue
        module = name.rpartition(".")[0]
        module = name if module in containers else module
        pattern = re.sub(r"\.\d+(?=\.|$)", ".*", module, count=1)
        bytes_by[pattern] += local_tensor_bytes(param)  # quantized: data + scales
        paths_by.setdefault(pattern, set()).add(module)
    return [{"module": m, "count": len(paths_by[m]), "bytes": b} for m, b in bytes_by.most_common()]


def _collectives(implied: dict, trace, inputs: FullInputs | None, class_name: str, cp_group: str | None) -> dict:
    """Collectives of the traced forward (measured: the tp axis's; the cp axis's apart), next to what the plan
    implies."""
    total = Counter()
    for counts in implied.values():
        total.update(counts)
    result = {"implied": dict(total)}
    if inputs is None:
        return {
            **result,
            "measured": None,
            "note": f"no input builder for {class_name}: counts implied by the plan only",
        }
    if isinstance(trace, PlanError):
        raise trace
    if isinstance(trace, Exception):  # data-dependent ops (MoE bincount, masks) have no fake kernel; cp refusals
        why = str(trace) if isinstance(trace, ForwardError) else type(trace).__name__
        note = f"the meta forward cannot run {class_name} ({why}): counts implied by the plan only"
        return {**result, "measured": None, "note": note}
    tp_records = [r for r in trace.collectives if r.group_name != cp_group]
    result.update(
        batch=1,
        resolution=inputs.height,
        input=inputs.pixels,
        img_tokens=inputs.tokens,
        txt_tokens=inputs.text_tokens,
        measured=_by_op(tp_records),
        count=len(tp_records),
        bytes=sum(r.bytes for r in tp_records),
        output_bytes=trace.output_bytes,
    )
    if cp_group is not None:
        result["cp_measured"] = _by_op([r for r in trace.collectives if r.group_name == cp_group])
    return result


def _by_op(records) -> dict:
    by_op = {}
    for record in records:
        entry = by_op.setdefault(record.op, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += record.bytes
    return by_op


def add_cfg(report: dict, cfg: int) -> None:
    """With --cfg > 1: the cfg exchange of one denoising step (`runtime.cfg.cost`), from the measured output."""
    check_degree(cfg, "dtp check: --cfg")
    if cfg == 1:
        return
    output_bytes = (report.get("collectives") or {}).get("output_bytes")
    if output_bytes is None:
        raise PlanError("dtp check: --cfg needs the measured forward of one model (not a pipeline, not --no-forward).")
    report["cfg"] = cfg
    report["cfg_exchange"] = exchange_per_step(output_bytes, cfg)


def is_pipeline_target(target: str) -> bool:
    """A released pipeline's name, or a name that asks for one (`*-pipeline`: unknown ones get the list)."""
    return target in RELEASED_PIPELINES or target.endswith(PIPELINE_SUFFIX)


def check_pipeline(
    name: str,
    *,
    tp: int,
    cp: int = 1,
    cp_mode: str = "ulysses",
    dtype: str = "bf16",
    pad: bool = False,
    whole_text_encoders: bool = False,
    ulysses: int | None = None,
) -> dict:
    """The `dtp check PIPELINE` report: every component of a released pipeline at full size, sharded by
    `parallelize_pipeline` on rank 0 of a fake group of `cp * tp` ranks, or whole with the reason.

    A text encoder whose plans do not fit `tp` stays whole, its PlanError the reason (`dtp run` would
    refuse it unless --whole-text-encoders); any other component that does not fit raises the PlanError.
    """
    _check_degrees(tp, cp)
    released = released_pipeline(name)
    with fake_world(tp * cp):
        mesh = make_mesh(tp=tp, cp=cp, device_type="cpu", ulysses=ulysses)
        modules = build_pipeline(released, parse_dtype(dtype))
        rows = [
            _component_row(n, m, mesh, cp_mode=cp_mode, pad=pad, whole=whole_text_encoders and _is_text_encoder(n))
            for n, m in modules.items()
        ]
    total, per_rank = sum(r["total_bytes"] for r in rows), sum(r["per_rank_bytes"] for r in rows)
    return {
        "pipeline": name,
        "title": released.title,
        "config": "released",
        "dtype": dtype,
        "tp": tp,
        "cp": cp,
        "world_size": tp * cp,
        "pad": pad,
        "components": rows,
        "params": sum(r["params"] for r in rows),
        "total_bytes": total,
        "per_rank_bytes": per_rank,
        "ideal_bytes": total // tp,
        "ratio": per_rank / (total / tp),
    }


def _component_row(name: str, module: torch.nn.Module, mesh, *, cp_mode: str, pad: bool, whole: bool) -> dict:
    """One component sharded alone by `parallelize_pipeline` (or kept whole), as a report row."""
    pipe = SimpleNamespace(components={name: module})
    params = sum(p.numel() for p in module.parameters())  # before padding adds any
    reason = "--whole-text-encoders" if whole else None
    try:
        report = parallelize_pipeline(pipe, mesh, {name: WHOLE} if whole else None, cp_mode=cp_mode, pad=pad)
    except PlanError as exc:  # nothing was mutated
        if not _is_text_encoder(name):
            raise
        reason = str(exc)
        report = parallelize_pipeline(pipe, mesh, {name: WHOLE})
    (c,) = report.components
    return {
        "name": name,
        "class": c.class_name,
        "plan": c.plan,
        "whole_reason": None if c.plan else reason or f"no plan for {c.class_name}",
        "params": params,
        "total_bytes": c.whole_bytes,
        "per_rank_bytes": c.local_bytes,
    }


def _is_text_encoder(component: str) -> bool:
    return component.startswith(TEXT_ENCODER_PREFIX)
