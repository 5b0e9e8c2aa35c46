"""diffusers' `enable_cache` on a dtp-sharded model goes through dtp: checked, then made rank-consistent.

`attach(model, parallelism)` runs last in `dtp.apply` (every sharding path passes there). On a model with
diffusers' CacheMixin it replaces the instance's `enable_cache` with `enable`, so the usual
`pipe.transformer.enable_cache(config)` after sharding is checked against the mesh (`kinds.check_config`,
a PlanError before any hook is added) and its hooks are made rank-consistent (`consistent.py`). A cache
enabled before sharding was already checked by `check_cache` in `prepare`; `attach` re-enables it through
`enable` (its hooks hold no state yet that matters: state is reset at every generation). A forward pre-hook
refuses, before anything runs, stateful hooks that reached the model some other way (diffusers' apply_*
functions): their decisions would be per rank.
"""

from __future__ import annotations

import copy
import functools

from torch import nn
from torch.distributed.fsdp import FSDPModule

from ..errors import ForwardError, PlanError
from ..runtime.cfg.hooks import hook_view
from ..runtime.cfg.host import axis_groups
from ..runtime.mesh import CFG_AXIS, CP_AXIS, TP_AXIS
from .consistent import make_consistent
from .kinds import check_config
from .scope import DecisionScope
from .sea import check_sea_model

GUARD_ATTR = "_dtp_cache_guard"  # on an attached model: the handle of its forward pre-hook


def degrees(mesh, fsdp: bool = False) -> dict[str, int]:
    """{"tp": .., "cp": .., "cfg": .., "fsdp": ..} of a dtp mesh (absent axes are 1; "fsdp" is the number of ranks
    a weight is sharded over when the model is sharded with fsdp=True: cfg x cp)."""
    names = mesh.mesh_dim_names or ()
    out = {axis: mesh[axis].size() if axis in names else 1 for axis in (TP_AXIS, CP_AXIS, CFG_AXIS)}
    return out | {"fsdp": out[CP_AXIS] * out[CFG_AXIS] if fsdp else 1}


def _sharded_by_fsdp(model: nn.Module) -> bool:
    return any(isinstance(module, FSDPModule) for module in model.modules())


def check_cache(model: nn.Module, mesh, fsdp: bool = False) -> None:
    """PlanError (nothing changed) when the cache enabled on `model` cannot run exactly on `mesh` (sharded with
    `fsdp` or not), or when stateful diffusers hooks are on it that no cache config accounts for."""
    config = getattr(model, "_cache_config", None)
    if config is not None:
        check_config(config, degrees(mesh, fsdp))
        check_sea_model(model, config)
    elif hook_view(model)[0] and mesh.size() > 1:
        raise PlanError(
            f"{type(model).__name__} has stateful diffusers hooks ({', '.join(hook_view(model)[0][:3])}) that no "
            "enable_cache config accounts for: dtp cannot make their decisions rank-consistent. Remove them, or "
            "enable the cache with model.enable_cache(config)."
        )


def attach(model: nn.Module, mesh) -> None:
    """Route `model.enable_cache` through dtp and guard its forward (see the module docstring)."""
    if not hasattr(type(model), "enable_cache") or mesh.size() == 1:
        return
    scope = DecisionScope(mesh, model, host=axis_groups(mesh))
    model.enable_cache = functools.partial(enable, model, scope)
    config = getattr(model, "_cache_config", None)
    if config is not None:  # enabled before sharding, checked in prepare
        type(model).disable_cache(model)
        enable(model, scope, config)
    if getattr(model, GUARD_ATTR, None) is None:
        setattr(model, GUARD_ATTR, model.register_forward_pre_hook(_guard))


def enable(model: nn.Module, scope: DecisionScope, config) -> None:
    """`model.enable_cache(config)` on a sharded model: refused (PlanError, nothing added) or rank-consistent."""
    check_config(config, degrees(scope.mesh, _sharded_by_fsdp(model)))
    check_sea_model(model, config)
    register_fsdp_blocks(model)
    type(model).enable_cache(model, config)
    make_consistent(model, scope)


def register_fsdp_blocks(model: nn.Module) -> None:
    """Register FSDP2's block classes in diffusers' TransformerBlockRegistry under their base class's metadata.

    `fully_shard` swaps each block's class for a subclass (`FSDPFluxTransformerBlock`), and diffusers' block
    caches (FirstBlockCache, MagCache) look the metadata up by exact class: without this, enable_cache on an
    fsdp=True model raises "Model class ... not registered". The subclass keeps the base's forward, so the
    base's metadata (output indices, signature) holds for it.
    """
    from diffusers.hooks._helpers import TransformerBlockRegistry

    TransformerBlockRegistry._register()  # diffusers fills its registry lazily
    known = TransformerBlockRegistry._registry
    for module in model.modules():
        cls = type(module)
        if not isinstance(module, FSDPModule) or cls in known:
            continue
        base = next((b for b in cls.__mro__[1:] if b in known), None)
        if base is not None:
            TransformerBlockRegistry.register(cls, copy.copy(known[base]))


def _guard(model: nn.Module, args) -> None:
    found = hook_view(model)[0]  # walked again only when a hook changed
    if found:
        raise ForwardError(
            f"stateful diffusers hooks were added to the sharded {type(model).__name__} behind dtp "
            f"({', '.join(found[:3])}): their decisions would be per rank. Use model.enable_cache(config), which "
            "goes through dtp.cache, instead of diffusers' apply_* functions."
        )
