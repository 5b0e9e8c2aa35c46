"""The public entry points on an in-memory model: `parallelize` and `tp_candidates` (thin callers of the engine)."""

from __future__ import annotations

from torch import nn

from .engine import apply, prepare, supported_tp
from .plan import Plan, plan_for
from .policy import check_degree
from .resolve import resolve


def parallelize(
    model: nn.Module,
    mesh,
    plan: Plan | None = None,
    *,
    cp_mode: str = "ulysses",
    device=None,
    pad: bool = False,
    fsdp: bool | int | str = False,
    attention_backend: str | None = None,
) -> nn.Module:
    """Shard `model` in place with `plan` (default: `plan_for(model)`) on `mesh`'s `tp` axis; returns it.

    When the mesh's `cp` axis is larger than 1, the plan's `cp` section splits the sequence over it
    and attention runs as `cp_mode`: "ulysses" (all-to-all, needs (heads / tp) % cp == 0) or "ring"
    (K/V passed around the ring, any head count). Every check runs before the first parameter is
    replaced or hook installed (`engine.prepare`): a call that raises PlanError leaves the model as it was.

    `device` (a device, or a type such as "cuda" meaning cuda:<local rank>, see
    `placement.local_device`) is for a model loaded whole on CPU: each sharded parameter's slice is
    cut on CPU and only the slice is moved; replicated parameters and buffers are moved whole.

    `pad=True` accepts a tp that does not divide the heads or widths: they are zero-padded to the
    next multiple of tp (zero q/k/v rows and output-projection columns; zero FFN units), which is
    exact and costs the padded compute, e.g. Z-Image's 30 heads run at tp=4 as 32 (8 per rank).

    `fsdp=True` also shards every weight over the mesh's non-tp axes (cfg x cp) with torch's FSDP2: one unit per
    transformer block plus the root, each gathered just before it runs and freed after (`runtime/fsdp.py`).
    `fsdp=4` groups 4 consecutive blocks in a unit, `fsdp="1GB"` blocks up to 1 GB a unit (`runtime/fsdp_unit.py`):
    FSDP2's host work per call divided by about the blocks grouped, 2 whole units gathered at once.

    `attention_backend` (`dtp.choices.ATTENTION_BACKENDS`: auto, flash, efficient, cudnn, math, or a diffusers
    backend name such as "_flash_3_hub" or "sage") is set on the model and used by Ulysses and ring attention; ring
    takes the ones whose kernel returns the log-sum-exp (`runtime/attention_backend.py`).
    """
    options = dict(cp_mode=cp_mode, device=device, pad=pad, fsdp=fsdp, attention_backend=attention_backend)
    return apply(model, prepare(model, mesh, plan, **options))


def tp_candidates(
    model: nn.Module,
    plan: Plan | None = None,
    *,
    cp: int = 1,
    cp_mode: str = "ulysses",
    pad: bool = False,
    ulysses: int | None = None,
) -> list[int]:
    """The TP degrees `model` supports under `plan` (default: `plan_for(model)`), e.g. [1, 2, 4, 8].

    With `cp > 1`, only the degrees that also work with that many context-parallel ranks in
    `cp_mode` (Ulysses: (heads / tp) % cp == 0; the plan needs a `cp` section).
    With `pad=True`, every degree from 1 up to the smallest head count the plan touches (Z-Image: 1..30).
    `ulysses=U` (USP, `make_mesh(cp=cp, ulysses=U)`): the heads split over U only, ring over cp / U.
    """
    check_degree(cp, "cp")
    resolved = resolve(plan if plan is not None else plan_for(model), model)
    return supported_tp(model, resolved, cp, cp_mode, pad=pad, ulysses=ulysses)
