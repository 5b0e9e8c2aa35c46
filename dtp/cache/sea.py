"""SeaCache's decision made rank-consistent: its indicator read from the whole latents, its gate agreed.

diffusers' SeaCache (`hooks/sea_cache.py`) decides once per transformer call, in its leader block hook, whether to
replace the block stack with a cached residual. The decision reads an *indicator*: a spectral filter (an FFT over
each sample's whole (C, T, H, W) latent) of the "raw vision" latents its root hook takes from the model's inputs
(`raw_vision_callback`; Wan T2V: `hidden_states.unbind(0)`, one latent per sample). An FFT over a piece of a latent
is not a piece of the FFT, so no reduction of partial sums can rebuild it; what dtp can do is make sure every rank
filters the latents one process filters:

    cp axis          dtp cuts Wan's sequence after the patch embedding: the model's hidden_states, and so the raw
                     latents, arrive whole on every rank. Checked per call (a fingerprint all-gathered over cp): a
                     callback reading a cut tensor is a ForwardError on every rank, raised by the gate (before any
                     block runs; diffusers turns errors of the callback itself into a silent fail-open)
    cfg, pair path   each group runs whole calls of its own branch; SeaCache's state is per cache context
    cfg, batch path  each group holds rows of the batch, so its latent list is its own samples: the lists of all
                     groups are gathered in row order (the one-process list; each rank filters every sample)

The gate itself (`SeaCacheSharedState.resolve_gate`, diffusers' formula and state) is then agreed over the ranks
of the forward (compute when any rank would), with diffusers' own handling of a vote that forces a computation
(accumulated distance reset; sea_cache.py's Cosmos 3 path does the same after its world vote): no rank can skip
the block stack while another runs it. Both replacements are attributes of this model's hook and shared state.
"""

from __future__ import annotations

import functools

import torch

from ..errors import ForwardError, PlanError
from ..runtime.cfg.exchange import gather_parts
from ..runtime.mesh import CFG_AXIS
from .scope import DecisionScope

MISMATCH_ATTR = "_dtp_sea_mismatch"  # on a SeaCacheSharedState: this call's raw latents differed between cp ranks


def check_sea_model(model, config) -> None:
    """PlanError (nothing changed) for SeaCache on a model diffusers has no raw-vision adapter for and no
    `raw_vision_callback` given: diffusers 0.42.1 (`apply_sea_cache`) then runs it fail-open, never skipping, in one
    process as on a mesh. Its adapters: Wan text-to-video (in_channels == out_channels) and Cosmos 3."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel

    if type(config).__name__ != "SeaCacheConfig" or config.raw_vision_callback is not None:
        return
    if isinstance(model, Cosmos3OmniTransformer):
        return
    if isinstance(model, WanTransformer3DModel) and model.config.in_channels == model.config.out_channels:
        return
    raise PlanError(
        f"SeaCacheConfig (sea) on {type(model).__name__}: diffusers has a raw-vision adapter for Wan text-to-video and "
        "Cosmos 3 only and no raw_vision_callback was given, so it would run fail-open and never skip. Pass "
        "SeaCacheConfig(raw_vision_callback=...) returning the whole (C, T, H, W) latents, called from a pipeline "
        "whose cache_context passes step_index, sigma and num_inference_steps (Wan's does; FluxPipeline's and "
        "QwenImagePipeline's pass none), or use another cache (fbc, taylorseer, mag, pab)."
    )


def make_sea_consistent(hook, scope: DecisionScope) -> None:
    """Re-scope one SeaCacheRootHook (and the shared state its leader hook decides with)."""
    shared = hook.shared_state
    if hook.raw_vision_callback is not None:  # None: diffusers runs fail-open, never skipping
        hook.raw_vision_callback = functools.partial(whole_latents, hook.raw_vision_callback, scope, shared)
    if not isinstance(shared.resolve_gate, functools.partial):
        shared.resolve_gate = functools.partial(agreed_gate, shared.resolve_gate, scope, shared)


def whole_latents(callback, scope: DecisionScope, shared, module, args, kwargs):
    """The raw vision latents one process would filter: gathered over cfg's batch split, checked equal over cp."""
    latents = callback(module, args, kwargs)
    if not latents:
        return latents
    group = scope.batch_group()
    if group is not None:
        host = None if scope.host is None else scope.host.get(CFG_AXIS)  # the shapes on a host group
        latents = [latent for part in gather_parts(list(latents), group, host) for latent in part]
    setattr(shared, MISMATCH_ATTR, not scope.same_over_cp(latents))
    return latents


def agreed_gate(resolve_gate, scope: DecisionScope, shared, state, metadata, indicator, config) -> bool:
    """diffusers' gate, then compute on every rank when any rank would."""
    if getattr(shared, MISMATCH_ATTR, False):  # the same on every cp rank: the fingerprints were all-gathered
        raise ForwardError(
            "SeaCache's raw vision latents differ between the cp ranks (its raw_vision_callback reads a tensor dtp "
            "cut): its spectral indicator would be per rank. Run SeaCache with cp=1, or give a callback that returns "
            "the whole latents."
        )
    local = resolve_gate(state, metadata, indicator, config)
    device = metadata.raw_vision[0].device if metadata.raw_vision else torch.device("cpu")
    compute = scope.agree_any(local, device)
    if compute and not local:
        state.accumulated_distance = 0.0
        state.gate_should_compute = True
    return compute
