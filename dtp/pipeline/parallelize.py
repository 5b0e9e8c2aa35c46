"""`parallelize_pipeline`: every component of a diffusers pipeline that has a plan, sharded by the one engine.

A pipeline's weights are mostly not the transformer's: FLUX.1-dev carries T5-XXL (4.8 B) and CLIP-L
next to its 11.9 B transformer, FLUX.2-dev a 24 B Mistral. So the text encoders are sharded too, by
the same planner (bundled plans for transformers classes, `plan/transformers.py` for the rest).

All components are prepared (every check, nothing mutated) before the first one is applied, so a
plan that does not fit the second component leaves the first one untouched.

Meshes: a diffusers model gets the whole ("cp", "tp") mesh (its plan's `cp` section splits the
sequence); a text encoder has no `cp` section and runs on the `tp` axis only, the same on every cp rank.
A component without any plan stays whole and is reported as such. The `vae` component of a class
`dtp.parallelize_vae` knows is split along the height over every rank instead (plan "rows"); one it does
not know stays whole, with the reason in its report.

On a mesh with a `cfg` axis > 1 every denoiser (`transformer*`, `unet` components, planned or not) also
gets the cfg wrapper (`runtime/cfg`): the guidance branches of each step run on different cfg groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torch import nn

from ..engine import apply, prepare_with
from ..errors import PlanError
from ..plan import Plan, bundled_plans_for, find_plan
from ..plan.transformers import is_transformers_model
from ..runtime.cfg import check_cfg, install_cfg
from ..runtime.compile import compile_backend, compile_blocks, repeated_blocks
from ..runtime.fsdp import is_fsdp, release
from ..runtime.memory import local_param_bytes
from ..runtime.parallelism import Parallelism
from ..vae import check_vae, install_vae

WHOLE = None  # `plans={"vae": dtp.pipeline.WHOLE}`: leave that component whole
DENOISERS = ("transformer", "unet")  # component name prefixes that the cfg axis wraps
VAE_COMPONENT = "vae"  # split along the height by dtp.parallelize_vae unless `plans` names it
VAE_PLAN = "rows"  # the report's plan name for a VAE split by rows


@dataclass(frozen=True)
class ComponentReport:
    """One pipeline component: its parameter bytes whole and as this rank holds them."""

    name: str
    class_name: str
    plan: str | None  # the plan's name, None when it stayed whole
    whole_bytes: int
    local_bytes: int
    note: str = ""  # why a component stayed whole, where there is a reason to give


@dataclass(frozen=True)
class PipelineReport:
    """What `parallelize_pipeline` sharded and what stayed whole, with this rank's bytes."""

    tp: int
    components: tuple[ComponentReport, ...]

    @property
    def whole_bytes(self) -> int:
        return sum(c.whole_bytes for c in self.components)

    @property
    def local_bytes(self) -> int:
        return sum(c.local_bytes for c in self.components)

    def __str__(self) -> str:
        rows = [f"{'component':<16} {'class':<36} {'plan':<18} {'whole MB':>10} {'this rank MB':>13}"]
        for c in self.components:
            rows.append(
                f"{c.name:<16} {c.class_name:<36} {c.plan or 'whole':<18} "
                f"{c.whole_bytes / 1e6:>10.2f} {c.local_bytes / 1e6:>13.2f}"
            )
        total = f"{'total':<16} {'':<36} {f'tp={self.tp}':<18}"
        rows.append(f"{total} {self.whole_bytes / 1e6:>10.2f} {self.local_bytes / 1e6:>13.2f}")
        rows += [f"{c.name}: {c.note}" for c in self.components if c.note]
        return "\n".join(rows)


def parallelize_pipeline(
    pipe,
    mesh,
    plans: Mapping[str, Plan | None] | None = None,
    *,
    exclude: Iterable[str] = (),
    cp_mode: str = "ulysses",
    device=None,
    pad: bool = False,
    fsdp: bool | int | str = False,
    attention_backend: str | None = None,
    compile: bool | str = False,
) -> PipelineReport:
    """Shard every component of `pipe` that has a plan, in place; returns what was sharded, with bytes.

    plans: per component name, a Plan or `WHOLE` (None) to leave it whole. A component not named gets
        the first of its bundled plans that fits the mesh (`bundled_plans_for`: e.g. CLIP's `clip`,
        else `clip-mlp` at tp=8), else its own plan (`find_plan`), and stays whole when it has none.
    exclude: component names not to touch at all (e.g. a transformer already sharded on load).
    device: as in `dtp.parallelize`: slices (and the rest of each sharded component) go there.
    pad: as in `dtp.parallelize`, for every component: heads and widths tp does not divide are
        zero-padded (exact), e.g. Qwen-Image's Qwen2.5-VL (28 heads) at tp=8.
    fsdp: every planned component's weights also divided over the mesh's non-tp axes (FSDP2, `runtime/fsdp.py`).
    attention_backend: as in `dtp.parallelize`, set on every sharded diffusers component (the transformer).
    compile: regional compile of every denoiser (`transformer*`, `unet`) once sharded: each repeated block
        compiled with `fullgraph=True` (`runtime/compile.py`); True is inductor, a string names the dynamo backend
        ("eager": traced, run eagerly). Lazy: the first call traces.
    Every component is prepared before any is applied: a PlanError leaves the whole pipeline as it was.
    """
    options = dict(cp_mode=cp_mode, pad=pad, device=device, fsdp=fsdp, attention_backend=attention_backend)
    parallelism = Parallelism.build(mesh, **options)
    return parallelize_with(pipe, parallelism, plans, exclude=exclude, compile=compile)


def parallelize_with(
    pipe, parallelism: Parallelism, plans=None, *, exclude: Iterable[str] = (), compile: bool | str = False
) -> PipelineReport:
    """`parallelize_pipeline` for callers that hold the parallel setup (`load_pipeline`)."""
    backend = compile_backend(compile)
    if backend is not None:
        check_compilable(pipe)
    mesh = parallelism.mesh
    plans = dict(plans or {})
    modules = {n: m for n, m in pipe.components.items() if isinstance(m, nn.Module) and n not in set(exclude)}
    unknown = set(plans) - set(modules)
    if unknown:
        raise ValueError(f"parallelize_pipeline: no module components {sorted(unknown)}; have {sorted(modules)}.")
    whole = {name: local_param_bytes(module) for name, module in modules.items()}
    prepared, vaes = {}, {}
    for name, module in modules.items():  # every check of every component first ...
        if name == VAE_COMPONENT and name not in plans:
            vaes[name] = _check_vae(module, mesh)
            continue
        given = [plans[name]] if name in plans else None
        ready = prepare_component(name, module, parallelism, plans=given)
        if ready is not None:
            prepared[name] = ready
    denoisers = [name for name in modules if name.startswith(DENOISERS)] if parallelism.cfg > 1 else []
    for name in denoisers:
        check_cfg(modules[name], mesh)
    for name, ready in prepared.items():  # ... then the mutations
        apply(modules[name], ready)
    for name in denoisers:  # a planned one has it from `apply` already (idempotent)
        install_cfg(modules[name], mesh, pipeline=pipe)
    for name, checked in vaes.items():
        if not isinstance(checked, str):
            install_vae(modules[name], checked, mesh)
    if parallelism.fsdp:
        release_before_decode(pipe)
    if backend is not None:
        compile_denoisers(pipe, backend)
    reports = []
    for name, module in modules.items():
        report = _report(name, module, prepared.get(name), whole[name])
        if name in vaes:
            checked = vaes[name]
            plan, note = (None, checked) if isinstance(checked, str) else (VAE_PLAN, "")
            report = ComponentReport(name, report.class_name, plan, report.whole_bytes, report.local_bytes, note)
        reports.append(report)
    return PipelineReport(parallelism.tp, tuple(reports))


def denoisers(pipe) -> dict:
    """{name: module} of the pipeline's denoisers (`transformer`, `transformer_2`, `unet`, ...)."""
    return {n: m for n, m in pipe.components.items() if isinstance(m, nn.Module) and n.startswith(DENOISERS)}


def check_compilable(pipe) -> None:
    """PlanError (nothing changed) when a denoiser has no blocks for regional compile (`repeated_blocks`)."""
    for module in denoisers(pipe).values():
        repeated_blocks(module)


def compile_denoisers(pipe, backend: str) -> int:
    """Regional compile (`runtime.compile.compile_blocks`) of every denoiser of `pipe`, sharded or whole; how many
    blocks."""
    return sum(compile_blocks(module, backend=backend) for module in denoisers(pipe).values())


RELEASING = "_dtp_releases_fsdp"  # on a VAE decoder that frees the pipeline's FSDP gathers before it runs


def release_before_decode(pipe) -> None:
    """A forward pre-hook on the VAE's decoder that returns every FSDP component of `pipe` to its shards
    (`runtime/fsdp.release`: no collective): the decode then runs without the first window the transformer's last
    call prefetched for a next call (FLUX.1-dev at cp=8: 0.23 GB), as `dtp fit` models the decode phase. Once."""
    decoder = getattr(pipe.components.get(VAE_COMPONENT), "decoder", None)
    if not isinstance(decoder, nn.Module) or getattr(decoder, RELEASING, False):
        return

    def hook(module, args):
        for component in pipe.components.values():
            if isinstance(component, nn.Module) and is_fsdp(component):
                release(component)

    decoder.register_forward_pre_hook(hook)
    setattr(decoder, RELEASING, True)


def _check_vae(vae: nn.Module, mesh):
    """`check_vae`'s result for a pipeline's VAE, or why it stays whole (a string)."""
    if mesh.size() == 1:
        return "whole (one rank)"
    try:
        return check_vae(vae)
    except PlanError as exc:
        return f"whole: {exc}"


def prepare_component(name: str, module: nn.Module, parallelism: Parallelism, *, plans: list | None = None):
    """`engine.prepare` for one component: on its mesh (`Parallelism.for_model`), with the first of `plans`
    (default: its own, `_own_plans`) that fits, else a PlanError naming the component; None when it has no
    plan (or only `WHOLE`). `parallelize_pipeline` calls it per component, and loaders that build the
    component themselves (`dtp run` loads text encoders shard-on-load) do too."""
    candidates = [plan for plan in (_own_plans(module) if plans is None else plans) if plan is not None]
    if not candidates:
        return None
    return _prepare_first(name, module, parallelism.for_model(module), candidates)


def _own_plans(module: nn.Module) -> list[Plan | None]:
    """The module's bundled plans (variants in order), else its own plan (None when it has none)."""
    return bundled_plans_for(module) or [find_plan(module)]


def _report(name: str, module: nn.Module, prepared, whole_bytes: int) -> ComponentReport:
    plan = prepared.plan.name if prepared is not None else None
    return ComponentReport(name, type(module).__name__, plan, whole_bytes, local_param_bytes(module))


def _prepare_first(name: str, module: nn.Module, parallelism: Parallelism, plans: list[Plan]):
    """`engine.prepare` with the first of `plans` that fits (a class's bundled variants, in order); else the
    first plan's PlanError, naming the component and how to leave it whole."""
    errors = []
    for plan in plans:
        try:
            return prepare_with(module, parallelism, plan)
        except PlanError as exc:
            errors.append(exc)
    tried = f" (also tried: {', '.join(p.name for p in plans[1:])})" if len(plans) > 1 else ""
    cli = " (dtp run: --whole-text-encoders)" if is_transformers_model(module) else ""
    raise PlanError(
        f"pipeline component '{name}' ({type(module).__name__}): {errors[0]}{tried} To keep it whole on every "
        f"rank, pass plans={{'{name}': dtp.pipeline.WHOLE}}{cli}."
    ) from errors[0]
