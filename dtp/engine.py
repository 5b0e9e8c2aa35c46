"""The one engine: `prepare` runs every check and mutates nothing; `apply` mutates.

`parallelize`, `from_pretrained`, `dtp check` (and every later entry point: pipelines, adapters)
call these two, so a check added to `prepare` guards all of them and they all fail the same way.

The mesh and the options travel as one `runtime.parallelism.Parallelism` (built once at each entry point;
`prepare_with` takes one directly). A style is a `dtp.styles.Style` class: `apply` asks each planned
module's style for its torch ParallelStyle.

`prepare` checks, in this order (the first failure raises PlanError, the model untouched):
  1. options: `cp_mode` is a known mode; `attention_backend` a known backend that ring can run when cp > 1
     (`policy.check_attention_backend`: its package found, its kernel returning the log-sum-exp for ring);
  2. the mesh: it has a `tp` axis (and maybe `cp`, `cfg`); the degrees are read from it;
  3. the plan: given, or `plan_for(model)`;
  4. the plan against the model (`resolve`): paths, globs (optional members), Linear and Embedding
     targets, packed blocks, attention modules and their head bookkeeping (kv heads too),
     colwise/rowwise pairs, `rmsnorm_across_heads` norms and the colwise projections they follow,
     `shard_output` modules, tied parameters;
  5. the TP degree: it divides every constraint (widths, blocks, heads); with `pad=True` instead,
     heads and widths are zero-padded to multiples of tp (`resolve/padding.py`; exact), and
     `Prepared.resolved` is the padded binding (the refusal without it suggests pad=True); kv heads
     fewer than tp are shared by tp / kv ranks (`resolve/kv_share.py`, transformers attention);
     then the plan shards exactly at this tp (`resolve/exact.py`): declared packed blocks, whole heads
     in one order across q/k/v/o (`alignment.py`), and rank 0's forward on meta tensors with local
     shapes (`flow.py`, cached per model structure, plan and tp);
  6. the `cp` section, when the mesh's `cp` axis is > 1: sites, pluggable attention, Ulysses heads
     (padded heads are multiples of tp * cp under Ulysses, so they divide);
  7. the device: of the mesh's device type; with a `cfg` axis > 1, the model can run on the cfg groups
     (`runtime/cfg`); a diffusers cache already enabled runs exactly on this mesh (`cache/kinds.py`);
  7b. with `fsdp=True`: the mesh has a non-tp axis > 1 (checked building the `Parallelism`), the model is not
     FSDP-sharded already and holds no torchao-quantized weight (`runtime/fsdp.py`);
  8. the ranks agree (`runtime/agree.py`): every rank of the mesh fingerprints what must be the same
     everywhere (the resolved plan, tp, cp, options, the model's class, structure, parameter names,
     shapes and dtypes, adapters, the dtp/torch/model-library versions) and one all_gather of a
     32-byte digest compares them; on a mismatch every rank raises the same PlanError naming the
     ranks and the first difference. A rank that fails steps 1 and 3-7 still joins this exchange
     (with its error as its fingerprint), so its peers raise with it instead of waiting for it.
     Skipped on a mesh of one rank and on the fake process group (`dtp check`). So `prepare` is
     collective: every rank of the mesh calls it, as every rank later runs the sharded forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from .cache import attach as attach_cache
from .cache import check_cache
from .errors import PlanError
from .plan import Plan, plan_for
from .policy import check_cp_mode, ulysses_degree
from .quant import check_quantized
from .resolve import CpResolved, Resolved, resolve, resolve_cp
from .resolve.exactness.exact import check_exact
from .resolve.transforms.kv_share import share_kv
from .resolve.transforms.padding import Padding, check_unpadded, pad_candidates, pad_cp, pad_resolved
from .runtime.agree import check_agree, failed, fingerprint
from .runtime.attention_backend import set_attention_backend
from .runtime.cfg import check_cfg, install_cfg
from .runtime.cp import apply_cp
from .runtime.fsdp import apply_fsdp, check_fsdp
from .runtime.heads import set_local_heads
from .runtime.mesh import tp_submesh, usp_groups
from .runtime.norms import install_sharded_norms
from .runtime.outputs import install_output_cuts
from .runtime.parallelism import Parallelism
from .runtime.placement import check_device, local_device
from .runtime.ties import retie

SPEC_ATTR = "_dtp_spec"  # on every planned Linear after `apply`: its LinearSpec (LoRA adapters split like it)


@dataclass(frozen=True)
class Prepared:
    """Everything `apply` needs, all of it checked: the plan bound to the model, the parallel setup."""

    resolved: Resolved  # padded for this tp when `padding` is set
    cp_resolved: CpResolved | None  # None when the mesh's cp axis is 1
    parallelism: Parallelism  # the mesh ("cp", "tp"), ("cfg", "cp", "tp") or 1-D "tp"; cp_mode, pad, device
    padding: Padding | None = None  # pad=True: the unpadded binding and the padded head counts

    @property
    def mesh(self):
        return self.parallelism.mesh

    @property
    def tp_mesh(self):
        return self.parallelism.tp_mesh

    @property
    def cp_mode(self) -> str:
        return self.parallelism.cp_mode

    @property
    def device(self) -> torch.device | None:
        """Where slices (and then everything else) go; None: leave in place."""
        return self.parallelism.device

    @property
    def tp(self) -> int:
        return self.tp_mesh.size()

    @property
    def plan(self) -> Plan:
        return self.resolved.plan


def prepare(
    model: nn.Module,
    mesh,
    plan: Plan | None = None,
    *,
    cp_mode: str = "ulysses",
    device=None,
    pad: bool = False,
    fsdp: bool | int | str = False,
    attention_backend: str | None = None,
) -> Prepared:
    """Run every check (see the module docstring for the order); mutate nothing; return what `apply` needs.

    Collective over `mesh`: every rank of it must call `prepare` (see step 8).
    """
    tp_submesh(mesh)  # step 2 first: without a usable mesh there is no one to agree with
    try:
        parallelism = Parallelism.build(
            mesh, cp_mode=cp_mode, pad=pad, device=device, fsdp=fsdp, attention_backend=attention_backend
        )
    except Exception as error:  # step 1: a rank with bad options still joins the exchange (step 8)
        check_agree(mesh, failed(error))
        raise
    return prepare_with(model, parallelism, plan)


def prepare_with(model: nn.Module, parallelism: Parallelism, plan: Plan | None = None) -> Prepared:
    """`prepare` for callers that already hold the parallel setup (the loader, pipelines)."""
    mesh = parallelism.mesh
    try:
        prepared = _check_locally(model, parallelism, plan)
    except Exception as error:
        check_agree(mesh, failed(error))  # raises on every rank when some ranks passed
        raise
    cp_mode = parallelism.cp_mode if prepared.cp_resolved is not None else "unused (cp=1)"
    options = {"cp_mode": cp_mode, "pad": parallelism.pad, "fsdp": parallelism.fsdp}
    if parallelism.attention_backend is not None:  # absent when unset: fingerprints of earlier setups unchanged
        options["attention_backend"] = parallelism.attention_backend
    if prepared.cp_resolved is not None and parallelism.ulysses not in (1, parallelism.cp):  # USP; else unchanged
        options["ulysses"] = parallelism.ulysses
    check_agree(mesh, fingerprint(model, prepared.resolved, prepared.cp_resolved, mesh, options))
    return prepared


def _check_locally(model: nn.Module, parallelism: Parallelism, plan: Plan | None) -> Prepared:
    """Steps 2-7 and 9: everything this rank can check on its own (the options were checked building
    `parallelism`)."""
    tp, cp, cp_mode, ulysses = parallelism.tp, parallelism.cp, parallelism.cp_mode, parallelism.ulysses
    resolved = resolve(plan if plan is not None else plan_for(model), model)
    check_quantized(model, resolved.linears, resolved.plan.name)
    padding = None
    if parallelism.pad:
        padding = pad_resolved(resolved, model, tp, tp * ulysses)  # heads split over tp, then over Ulysses
        _check_pad_applies(padding, ulysses)
        resolved = padding.resolved
    else:
        check_unpadded(resolved, model, tp, partial(supported_tp, model, resolved, cp, cp_mode, True, ulysses))
    resolved = share_kv(resolved, model, tp)
    check_exact(resolved, model, tp)
    cp_resolved = None
    if cp > 1:
        cp_resolved = resolve_cp(resolved, model)
        cp_resolved = pad_cp(cp_resolved, padding) if padding is not None else cp_resolved
        cp_resolved.check(tp, cp, cp_mode, ulysses)
    if parallelism.device is not None:
        parallelism = parallelism.with_device(local_device(parallelism.device))
        check_device(parallelism.device, parallelism.tp_mesh)
    if parallelism.cfg > 1:
        _check_cfg_plan(resolved.plan, model, parallelism.cfg)
        check_cfg(model, parallelism.mesh)
    if parallelism.fsdp:
        check_fsdp(model)
    check_cache(model, parallelism.mesh, fsdp=parallelism.fsdp)
    return Prepared(resolved, cp_resolved, parallelism, padding)


def _check_cfg_plan(plan: Plan, model: nn.Module, cfg: int) -> None:
    """The plan's `cfg_refused`: the cfg axis splits each call's batch by rows, which this model's inputs are not."""
    if plan.cfg_refused is not None:
        raise PlanError(
            f"plan {plan.name} ({type(model).__name__}): cfg={cfg} cannot run this model: {plan.cfg_refused} "
            f"Use cfg=1 and put those ranks on cp or tp (e.g. dtp.make_mesh(cp={cfg}))."
        )


def _check_pad_applies(padding: Padding, ulysses: int) -> None:
    """Padding is written into the tp shards, so at tp=1 nothing is padded: a plan that needs padding there (only
    Ulysses asks for it, heads a multiple of its degree) would fail at its first forward instead."""
    if padding.tp > 1 or padding.is_noop:
        return
    heads = ", ".join(f"{h.path}: {h.heads} -> {h.padded_heads}" for h in padding.heads if h.padded_heads != h.heads)
    raise PlanError(
        f"pad=True at tp=1 pads nothing (padding lives in the tp shards), but Ulysses over {ulysses} ranks needs heads "
        f"padded ({heads}); use cp_mode='ring', a mesh with tp > 1, or a Ulysses degree that divides the heads."
    )


def _head_factor(cp: int, cp_mode: str, ulysses: int | None = None) -> int:
    """Padded heads are multiples of tp * this: the Ulysses degree (each rank's heads are split over it; cp under
    plain Ulysses, U under USP, 1 under ring)."""
    return ulysses_degree(cp, cp_mode, ulysses) if cp > 1 else 1


def apply(model: nn.Module, prepared: Prepared, *, weights_local: bool = False) -> nn.Module:
    """Shard `model` in place as `prepared` says; returns it. Only ever called on a `prepare`d model.

    weights_local: the planned parameters are already this rank's DTensors (the loader placed
        them); only the forward hooks are installed and nothing is moved.
    Otherwise each planned parameter is cut from the full tensor on this rank, and with
    `prepared.device` only the slice moves there, then everything else (replicated parameters, buffers).
    """
    device = None if weights_local else prepared.device
    if prepared.tp > 1:
        _apply_tp(model, prepared, device, weights_local)
    if device is not None:
        move_unsharded(model, device)
    set_attention_backend(model, prepared.parallelism.attention_backend)
    if prepared.cp_resolved is not None:
        backend = prepared.parallelism.attention_backend
        usp = usp_groups(prepared.parallelism.root)  # make_mesh(cp=C, ulysses=U): Ulysses x ring
        apply_cp(model, prepared.cp_resolved, prepared.parallelism.cp_mesh, prepared.cp_mode, backend, usp)
    if prepared.parallelism.cfg > 1:
        install_cfg(model, prepared.mesh)  # each call's branches over the cfg groups (runtime/cfg)
    attach_cache(model, prepared.mesh)  # enable_cache through dtp: checked, rank-consistent (dtp/cache)
    if prepared.parallelism.fsdp:
        # last: it shards what TP left on each rank, in units of the size fsdp= asks (True: dtp's units)
        apply_fsdp(model, prepared.parallelism.fsdp_mesh, prepared.parallelism.fsdp)
    return model


def _apply_tp(model: nn.Module, prepared: Prepared, device, weights_local: bool) -> None:
    """The TP half of `apply` (tp > 1 only: at tp=1 every parameter stays a plain tensor, so the forward runs
    without DTensor dispatch, which cost 1.21x on a GPU for DTensors on a 1-rank mesh)."""
    for spec in prepared.resolved.linears:
        style = spec.style.parallel_style(spec, device=device, weights_local=weights_local)
        module = model.get_submodule(spec.path)
        parallelize_module(module, prepared.tp_mesh, style)
        setattr(module, SPEC_ATTR, spec)
    retie(model, prepared.resolved.ties)
    install_sharded_norms(model, prepared.resolved.norms, prepared.tp_mesh, device=device, weights_local=weights_local)
    install_output_cuts(model, prepared.resolved.outputs, prepared.tp_mesh)
    set_local_heads(model, prepared.resolved.attention, prepared.tp)


def move_unsharded(model: nn.Module, device) -> None:
    """Move every plain (non-DTensor) parameter and buffer of `model` to `device`, in place."""
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and not isinstance(param.data, DTensor) and param.device != device:
                module._parameters[name] = nn.Parameter(param.data.to(device), requires_grad=param.requires_grad)
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def supported_tp(
    model: nn.Module, resolved: Resolved, cp: int, cp_mode: str, pad: bool = False, ulysses: int | None = None
) -> list[int]:
    """`resolved.candidates()` narrowed to the degrees that also work with `cp` ranks in `cp_mode` (USP: Ulysses
    degree `ulysses`, ring over the rest; None: `cp_mode`'s).

    pad=True: every degree from 1 to the smallest head count that padding serves (`padding.pad_candidates`).
    """
    if cp > 1:
        check_cp_mode(cp_mode)
    cp_resolved = resolve_cp(resolved, model) if cp > 1 else None
    if pad:
        if cp_resolved is None:
            return pad_candidates(resolved, model)
        return pad_candidates(
            resolved,
            model,
            _head_factor(cp, cp_mode, ulysses),
            lambda t, padding: pad_cp(cp_resolved, padding).allows(t, cp, cp_mode, ulysses),
        )
    if cp_resolved is None:
        return resolved.candidates()
    return [t for t in resolved.candidates() if cp_resolved.allows(t, cp, cp_mode, ulysses)]
