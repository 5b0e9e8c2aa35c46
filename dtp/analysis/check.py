"""What `dtp check` measures: a plan at full size, without GPUs or memory (the CLI: `dtp/tools/check.py`).

Builds the model at full size on the meta device, joins torch's fake process group of `cp * tp`
ranks (see `fakepg.py`), resolves and applies the plan exactly as `parallelize` does on rank 0, and
reports what one rank would hold and send:

    total        = sum of every parameter's bytes
    per rank     = sum of this rank's local shards (replicated parameters whole)
    ideal        = total / tp            (the physical limit: nothing replicated)
    ratio        = per rank / ideal      (1.00 is perfect; diffusers' FLUX.1-dev plan: 2.93 at tp 8)

and the collectives of one forward, counted while a meta forward runs at a stated resolution (one
denoising step without CFG; true CFG runs two). Weights are replicated along `cp`, so the memory
figures do not depend on `cp`; the collectives listed are the tensor-parallel ones on the `tp` axis.

`dtp check flux-pipeline --tp N` (also flux2-pipeline, qwenimage-pipeline; configs in `released.py`):
every component of a released pipeline as `dtp.parallelize_pipeline` shards it, its plan or whole with
the reason, and the same figures for the pipeline (total, per rank, ideal = total / tp, ratio). Memory
only: no forward, no collectives.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace
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
from ..runtime.cfg.tree import leaves
from ..runtime.memory import local_param_bytes, local_tensor_bytes
from ..runtime.mesh import make_mesh
from .collectives import CollectiveCounter, implied_collectives
from .fakepg import default_config, fake_world, meta_inputs, meta_model, read_config
from .lint import lint_report
from .released import RELEASED_PIPELINES, build_pipeline, released_pipeline

TOP_REPLICATED = 6
LATENT_PIXELS_PER_TOKEN = 16  # VAE downsampling 8 x patch 2, for all four bundled architectures
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
    resolution: int = 1024,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    forward: bool = True,
    pad: bool = False,
    quant: str | None = None,
) -> dict:
    """The `dtp check` report as a dict; PlanError on a bad target, config, degree or plan."""
    _check_degrees(tp, cp)
    class_name, the_plan = _target(target, plan)
    cfg = read_config(config) if config else None
    report = measure(
        class_name,
        the_plan,
        tp=tp,
        cp=cp,
        cp_mode=cp_mode,
        config=cfg,
        dtype=dtype,
        resolution=resolution,
        text_tokens=text_tokens,
        forward=forward,
        pad=pad,
        quant=quant,
    )
    report["config"] = config or report["config"]
    report["lint"] = lint_report(class_name, the_plan)
    return report


def measure(
    class_name: str,
    plan: Plan | None,
    *,
    tp: int,
    cp: int = 1,
    cp_mode: str = "ulysses",
    config: dict | None = None,
    dtype: str = "bf16",
    resolution: int = 1024,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    forward: bool = True,
    pad: bool = False,
    quant: str | None = None,
) -> dict:
    """Build `class_name` on meta, shard it with `plan` (None: `plan_for`) on rank 0 of a fake world.

    `forward=False` skips the meta forward (and the measured collectives), for callers after memory only.
    `pad=True` zero-pads heads and widths tp does not divide; `report["padding"]` says what that costs
    (`padding.overhead`); `total_bytes` and `ideal_bytes` stay the unpadded model's.
    `quant` (a `dtp.quant.SCHEMES` name): every Linear quantized by torchao first (on meta), so every byte
    figure is the quantized one (data + scales).
    """
    model = meta_model(class_name, config, parse_dtype(dtype))
    if quant is not None:
        quantize(model, config_for(quant))
    with fake_world(tp * cp):
        prepared = prepare(model, make_mesh(tp=tp, cp=cp, device_type="cpu"), plan, cp_mode=cp_mode, pad=pad)
        unpadded = prepared.padding.unpadded if prepared.padding is not None else prepared.resolved
        report = _layout_report(model, unpadded, class_name, config, dtype, tp, cp, cp_mode, pad)
        report["quant"] = quant
        report["padding"] = overhead(prepared.padding, model) if prepared.padding is not None else None
        # Weights only: the cp hooks are left out, so the meta forward counts the tensor-parallel collectives.
        apply(model, replace(prepared, cp_resolved=None))
        report["per_rank_bytes"] = local_param_bytes(model)
        if forward:
            report["collectives"] = _collectives(
                model, prepared.resolved, class_name, parse_dtype(dtype), resolution, text_tokens
            )
    report["ratio"] = report["per_rank_bytes"] / (report["total_bytes"] / tp)
    return report


def _layout_report(model, resolved: Resolved, class_name, config, dtype, tp, cp, cp_mode, pad) -> dict:
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
        "candidates": supported_tp(model, resolved, cp, cp_mode, pad=pad),
        "replicated": replicated_modules(model, resolved)[:TOP_REPLICATED],
    }


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


def resolve_target(target: str, plan: str | None) -> tuple[str, Plan | None]:
    """`dtp check`'s MODEL_OR_PLAN (and --plan) as (class name, plan or None for `plan_for`); PlanError otherwise."""
    return _target(target, plan)


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


def _collectives(model, resolved, class_name, dtype, resolution, text_tokens) -> dict:
    """Collectives of one meta forward (measured), next to what the plan implies."""
    implied = Counter()
    for counts in implied_collectives(resolved, model).values():
        implied.update(counts)
    result = {"implied": dict(implied)}
    if resolution % LATENT_PIXELS_PER_TOKEN:
        raise PlanError(f"dtp check: --resolution {resolution} must be a multiple of {LATENT_PIXELS_PER_TOKEN}.")
    img_tokens = (resolution // LATENT_PIXELS_PER_TOKEN) ** 2
    if class_name not in FAMILIES:
        result["measured"] = None
        result["note"] = f"no input builder for {class_name}: counts implied by the plan only"
        return result
    try:
        inputs = meta_inputs(class_name, model.config, dtype, img_tokens=img_tokens, txt_tokens=text_tokens)
        with torch.no_grad(), CollectiveCounter(model) as counter:
            output = model(**inputs)
    except (PlanError, ForwardError):
        raise
    except Exception as exc:  # noqa: BLE001 - data-dependent ops (MoE bincount, masks) have no meta kernel
        result["measured"] = None
        result["note"] = (
            f"the meta forward cannot run {class_name} ({type(exc).__name__}): counts implied by the plan only"
        )
        return result
    by_op = {}
    for record in counter.records:
        entry = by_op.setdefault(record.op, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += record.bytes
    result.update(
        batch=1,
        resolution=resolution,
        input=describe_input(model, inputs, resolution),
        img_tokens=img_tokens,
        txt_tokens=text_tokens,
        measured=by_op,
        count=len(counter.records),
        bytes=counter.total_bytes(),
        output_bytes=sum(t.numel() * t.element_size() for t in leaves(output)),
    )
    return result


def describe_input(model, inputs: dict, resolution: int) -> str:
    """What the meta forward ran on, in the model's terms: `1024x1024 px` for an image model; for a video
    model its latent video as frames x height x width (latent pixels; the VAE scales height and width by 8
    and frames by its temporal factor). The video layouts: (B, C, F, H, W) (Wan, Mochi, Cosmos,
    HunyuanVideo), (B, F, C, H, W) (CogVideoX), and tokens with `num_frames`/`height`/`width` beside them (LTX).
    """
    if "num_frames" in inputs:
        grid = (inputs["num_frames"], inputs["height"], inputs["width"])
    else:
        hidden = inputs.get("hidden_states")
        if hidden is None or hidden.ndim != 5:
            return f"{resolution}x{resolution} px"
        channels_first = hidden.shape[1] == getattr(model.config, "in_channels", None)
        grid = tuple(hidden.shape[2:]) if channels_first else (hidden.shape[1], *hidden.shape[3:])
    return "a latent video of {} x {} x {} (frames x height x width)".format(*grid)


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
) -> dict:
    """The `dtp check PIPELINE` report: every component of a released pipeline at full size, sharded by
    `parallelize_pipeline` on rank 0 of a fake group of `cp * tp` ranks, or whole with the reason.

    A text encoder whose plans do not fit `tp` stays whole, its PlanError the reason (`dtp run` would
    refuse it unless --whole-text-encoders); any other component that does not fit raises the PlanError.
    """
    _check_degrees(tp, cp)
    released = released_pipeline(name)
    with fake_world(tp * cp):
        mesh = make_mesh(tp=tp, cp=cp, device_type="cpu")
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
