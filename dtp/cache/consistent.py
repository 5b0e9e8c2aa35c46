"""Make the hooks diffusers' `enable_cache` just installed rank-consistent; the caching stays diffusers'.

For every diffusers hook under the model: a BodyProbe below it (CP's attention check then tells a cached
attention from one that attended locally), the cfg axis's mark (`BRANCH_ATTR`: per-context or shared
state), and, where the hook decides from a tensor, its decision read globally:

    FBCHeadBlockHook._should_compute_remaining_blocks(r)     diffusers:  mean|r - r_prev| / mean|r_prev| > t
        dtp: the same two means over the whole tensor (`DecisionScope.means`), then agreed over the forward
    MagCacheBlockHook._perform_calibration_step(state, r)    diffusers:  mean_tokens(|r|_2 / (|r_prev|_2 + 1e-8))
        dtp: the same mean over every token of the cut sequence
    SeaCacheRootHook.raw_vision_callback, resolve_gate      see `sea.py`: whole latents, the gate agreed

Each replacement is an attribute of the hook instance (the class is untouched, other models keep diffusers'
own), and keeps diffusers' formula and state; only the reductions become global.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..runtime.cfg import BRANCH_ATTR, branch_state
from ..runtime.cfg.hooks import changed
from ..runtime.probe import BodyProbe
from .scope import DecisionScope
from .sea import make_sea_consistent


def make_consistent(model: nn.Module, scope: DecisionScope) -> None:
    """Probe, mark and (where it decides from a tensor) re-scope every diffusers hook under `model`."""
    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is None or not registry.hooks:
            continue
        for hook in registry.hooks.values():
            setattr(hook, BRANCH_ATTR, branch_state(hook))
            _rescope(hook, scope)
        _probe(module, registry)
    changed()  # the marks change what the cfg wrapper's and the guard's cached hook views say


def _rescope(hook, scope: DecisionScope) -> None:
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook
    from diffusers.hooks.mag_cache import MagCacheBlockHook
    from diffusers.hooks.sea_cache import SeaCacheRootHook

    if isinstance(hook, FBCHeadBlockHook):
        hook._should_compute_remaining_blocks = functools.partial(fbc_should_compute, hook, scope)
    elif isinstance(hook, MagCacheBlockHook):
        hook._perform_calibration_step = functools.partial(mag_calibration_step, scope)
    elif isinstance(hook, SeaCacheRootHook):
        make_sea_consistent(hook, scope)


def _probe(module: nn.Module, registry) -> None:
    """A BodyProbe under the innermost hook: the module's own forward, where only a real run arrives."""
    bottom = registry._fn_refs[0]
    if bottom.original_forward is not None:  # a hook with new_forward: it calls this when it computes
        if not isinstance(bottom.original_forward, BodyProbe):
            bottom.original_forward = BodyProbe(module, bottom.original_forward)
    elif not isinstance(bottom.forward, BodyProbe):
        bottom.forward = BodyProbe(module, bottom.forward)


def fbc_should_compute(hook, scope: DecisionScope, residual: torch.Tensor) -> bool:
    """diffusers' FirstBlockCache decision with its means over the whole (uncut) residual, agreed."""
    state = hook.state_manager.get_state()
    previous = state.head_block_residual
    compute = True
    if previous is not None:
        change, size = scope.means((residual - previous).abs(), previous.abs())
        compute = change / size > hook.threshold
    return scope.agree_any(compute, residual.device)


def mag_calibration_step(scope: DecisionScope, state, residual: torch.Tensor) -> None:
    """diffusers' MagCache calibration ratio, its token mean over the whole sequence."""
    ratio = 1.0
    if state.previous_residual is not None:
        current = torch.linalg.norm(residual.float(), dim=-1)
        previous = torch.linalg.norm(state.previous_residual.float(), dim=-1)
        (ratio,) = scope.means(current / (previous + 1e-8))
    state.calibration_ratios.append(ratio)
