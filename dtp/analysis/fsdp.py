"""`dtp check --fsdp`: a rank's weight bytes with FSDP2, traced at full size (meta device, fake process group).

The model is sharded exactly as `dtp.parallelize(model, make_mesh(tp, cp, cfg), fsdp=True)` shards it, on rank 0 of
a fake world of cfg x cp x tp ranks, and its parameters are counted as FSDP2 holds them (`runtime/fsdp.py`):

    sharded   = every unit at rest, before the first call: each parameter's dim-0 chunk (torch.chunk, padded) of its
                tp slice over F = cfg x cp ranks (>= tp-local bytes / F: the chunk rounds up)
    resident  = between calls: the blocks' chunks, the root's own parameters gathered at their tp slice (the root
                keeps them after the first call) = the figure `dtp fit`'s fsdp rows use (`fit/fsdp.py`)

The whole blocks gathered in flight (2 while denoising) come on top; `dtp fit` models them. A released pipeline
(`dtp check flux-pipeline --cp 2 --fsdp`): each planned component sharded alone the same way (`fsdp_pipeline_bytes`).
"""

from __future__ import annotations

from types import SimpleNamespace

from ..engine import apply, prepare
from ..pipeline import parallelize_pipeline
from ..plan import Plan
from ..policy import parse_dtype
from ..runtime.fsdp import is_fsdp, resident_bytes
from ..runtime.memory import local_param_bytes
from ..runtime.mesh import make_mesh
from .fakepg import fake_world, meta_model
from .released import build_pipeline, released_pipeline


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
) -> dict:
    """{"fsdp": F, "fsdp_per_rank_bytes": resident, "fsdp_sharded_bytes": sharded} of `class_name` sharded with
    fsdp=True (module docstring); PlanError as `dtp.prepare` raises it (e.g. cfg x cp = 1)."""
    model = meta_model(class_name, config, parse_dtype(dtype))
    with fake_world(cfg * cp * tp):
        mesh = make_mesh(tp=tp, cp=cp, cfg=cfg, device_type="cpu")
        apply(model, prepare(model, mesh, plan, cp_mode=cp_mode, pad=pad, fsdp=True))
        return {
            "fsdp": cfg * cp,
            "fsdp_per_rank_bytes": resident_bytes(model),
            "fsdp_sharded_bytes": local_param_bytes(model),
        }


def fsdp_pipeline_bytes(
    name: str, planned: set[str], *, tp: int, cp: int, cp_mode: str = "ulysses", dtype: str = "bf16", pad: bool = False
) -> dict[str, int]:
    """{component: resident bytes} of the `planned` components of released pipeline `name` (full size, meta), each
    sharded alone with fsdp=True as `dtp.parallelize_pipeline(..., fsdp=True)` shards it, on rank 0 of a fake world of
    cp x tp ranks (a pipeline target takes no cfg axis in `dtp check`)."""
    modules = build_pipeline(released_pipeline(name), parse_dtype(dtype))
    out = {}
    with fake_world(cp * tp):
        mesh = make_mesh(tp=tp, cp=cp, device_type="cpu")
        for component in sorted(planned):
            pipe = SimpleNamespace(components={component: modules[component]})
            parallelize_pipeline(pipe, mesh, cp_mode=cp_mode, pad=pad, fsdp=True)
            module = modules[component]  # the VAE is split by rows, not FSDP-sharded: its weights stay whole
            out[component] = resident_bytes(module) if is_fsdp(module) else local_param_bytes(module)
    return out
