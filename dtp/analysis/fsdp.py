"""A rank's weight bytes with FSDP2, traced at full size (meta device, fake process group): `dtp check --fsdp` and
`dtp fit`'s fsdp rows both read `traced_fsdp`.

A component is sharded exactly as `dtp.parallelize_pipeline(pipe, make_mesh(tp, cp, cfg), fsdp=True)` shards it
(`pipeline.prepare_component` then `engine.apply`), on rank 0 of a fake world of cfg x cp x tp ranks, and its
parameters are counted as FSDP2 holds them (`runtime/fsdp.py`):

    sharded   = every unit at rest, before the first call: each matrix's dim-0 chunk (torch.chunk, padded) of its
                tp slice over F = cfg x cp ranks (>= tp-local bytes / F: the chunk rounds up); each vector (bias, norm
                weight: FSDP2 leaves it out, `runtime/fsdp.fsdp_shards`) whole at its tp slice
    resident  = between calls: the units' chunks, the root's own matrices gathered at their tp slice (the root
                keeps them after the first call), the vectors whole
    in flight = on top of resident while the blocks run: the running unit's matrices and its prefetch window's,
                gathered at their tp slice (`runtime/fsdp.in_flight_bytes`); between calls the first window (a
                pipeline frees it before its VAE decodes)
    units     = each gathering unit's tp-local bytes in forward order; `first_window` the first window's bytes

e.g. FLUX.1-dev bf16 at (cp=8, tp=1): resident 3.09 GB, in flight 0.57 GB (two single blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..engine import apply
from ..pipeline.parallelize import prepare_component
from ..plan import Plan
from ..policy import parse_dtype
from ..runtime.fsdp import LAYOUT_ATTR, in_flight_bytes, prefetch_windows, resident_bytes
from ..runtime.memory import local_param_bytes
from ..runtime.mesh import make_mesh
from ..runtime.parallelism import Parallelism
from .fakepg import fake_world, meta_model
from .released import build_pipeline, released_pipeline


@dataclass(frozen=True)
class FsdpFigures:
    """One component's bytes on a rank with fsdp=True (module docstring)."""

    fsdp: int
    resident: int
    sharded: int
    in_flight: int
    units: tuple[int, ...]
    first_window: int


def figures(model: nn.Module, fsdp: int) -> FsdpFigures:
    """The figures of `model`, sharded by `runtime/fsdp.apply_fsdp` over `fsdp` ranks."""
    sizes = [unit.size for unit in getattr(model, LAYOUT_ATTR).gathered()]
    first = prefetch_windows(sizes, getattr(model, LAYOUT_ATTR).cap)[0]
    return FsdpFigures(
        fsdp=fsdp,
        resident=resident_bytes(model),
        sharded=local_param_bytes(model),
        in_flight=in_flight_bytes(model),
        units=tuple(sizes),
        first_window=sum(sizes[j] for j in first),
    )


def traced_fsdp(
    name: str,
    module: nn.Module,
    *,
    tp: int,
    cp: int = 1,
    cfg: int = 1,
    cp_mode: str = "ulysses",
    pad: bool = False,
    plan: Plan | None = None,
    fsdp=True,
) -> FsdpFigures | None:
    """`module` (on meta; mutated) sharded with `fsdp` (True or a unit size: `runtime/fsdp_unit.py`) as
    `parallelize_pipeline` shards component `name` (with `plan`, else its own), on rank 0 of a fake world of
    cfg x cp x tp ranks; None when it has no plan (held whole). PlanError as `dtp.prepare` raises it (e.g. cfg x cp =
    1)."""
    with fake_world(cfg * cp * tp):
        mesh = make_mesh(tp=tp, cp=cp, cfg=cfg, device_type="cpu")
        parallelism = Parallelism.build(mesh, cp_mode=cp_mode, pad=pad, fsdp=fsdp)
        prepared = prepare_component(name, module, parallelism, plans=None if plan is None else [plan])
        if prepared is None:
            return None
        apply(module, prepared)
        return figures(module, cfg * cp)


def fsdp_bytes(
    class_name: str,
    plan: Plan | None,
    *,
    tp: int,
    cp: int = 1,
    cfg: int = 1,
    cp_mode: str = "ulysses",
    config: dict | None = None,
    dtype: str = "bf16",
    pad: bool = False,
    fsdp=True,
) -> dict:
    """{"fsdp": F, "fsdp_per_rank_bytes": resident, "fsdp_sharded_bytes": sharded, "fsdp_in_flight_bytes"} of
    `class_name` sharded with fsdp=True (module docstring); PlanError as `dtp.prepare` raises it."""
    model = meta_model(class_name, config, parse_dtype(dtype))
    f = traced_fsdp("transformer", model, tp=tp, cp=cp, cfg=cfg, cp_mode=cp_mode, pad=pad, plan=plan, fsdp=fsdp)
    return {
        "fsdp": f.fsdp,
        "fsdp_per_rank_bytes": f.resident,
        "fsdp_sharded_bytes": f.sharded,
        "fsdp_in_flight_bytes": f.in_flight,
    }


def fsdp_pipeline_bytes(
    name: str,
    planned: set[str],
    *,
    tp: int,
    cp: int,
    cfg: int = 1,
    cp_mode: str = "ulysses",
    dtype: str = "bf16",
    pad: bool = False,
    fsdp=True,
) -> dict[str, FsdpFigures | None]:
    """{component: figures, None when it stays whole} of the `planned` components of released pipeline `name` (full
    size, meta), each sharded alone with fsdp=True as `dtp.parallelize_pipeline(..., fsdp=True)` shards it on a
    (cfg, cp, tp) mesh: FSDP over the cfg x cp ranks, text encoders on the tp axis only (`Parallelism.for_model`)."""
    modules = build_pipeline(released_pipeline(name), parse_dtype(dtype))
    options = dict(tp=tp, cp=cp, cfg=cfg, cp_mode=cp_mode, pad=pad, fsdp=fsdp)
    return {component: traced_fsdp(component, modules[component], **options) for component in sorted(planned)}
