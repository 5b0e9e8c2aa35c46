"""The caches by short name, as `dtp run --cache NAME [--cache-threshold X]` and `dtp serve` take them.

`make_config(pipe, name, threshold, steps)` builds diffusers' config with its defaults; the timestep of the
schedule caches is read from the pipeline (`pipe.current_timestep`, set by every diffusers pipeline while it
denoises). `apply_cache(pipe, name, threshold)` enables it on `pipe.transformer`: on a dtp-sharded
transformer that goes through `dtp.cache.enable` (checked against the mesh, then rank-consistent).

    name        config                              --cache-threshold
    fbc         FirstBlockCacheConfig               threshold (default 0.05)
    taylorseer  TaylorSeerCacheConfig               -
    pab         PyramidAttentionBroadcastConfig     -   (spatial attention reused every other call)
    faster      FasterCacheConfig                   -
    mag         MagCacheConfig (FLUX_MAG_RATIOS)    threshold (default 0.06); needs num_inference_steps
    sea         SeaCacheConfig                      threshold (default 0.25)
"""

from __future__ import annotations

from ..choices import CACHE_NAMES
from ..errors import PlanError

_THRESHOLDS = {"fbc", "mag", "sea"}


def make_config(pipe, name: str, threshold: float | None = None, steps: int | None = None):
    """diffusers' config for the cache `name` (see the module docstring); PlanError for a bad name or option."""
    import diffusers.hooks as hooks
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    if name not in CACHE_NAMES:
        raise PlanError(f"cache '{name}': not one of {', '.join(CACHE_NAMES)}.")
    if threshold is not None and name not in _THRESHOLDS:
        raise PlanError(f"cache '{name}' has no threshold (only {', '.join(sorted(_THRESHOLDS))} do); drop it.")
    given = {} if threshold is None else {"threshold": threshold}

    def timestep():
        return pipe.current_timestep

    if name == "fbc":
        return hooks.FirstBlockCacheConfig(**given)
    if name == "taylorseer":
        return hooks.TaylorSeerCacheConfig()
    if name == "pab":
        return hooks.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, current_timestep_callback=timestep
        )
    if name == "faster":
        return hooks.FasterCacheConfig(current_timestep_callback=timestep)
    if name == "mag":
        if steps is None:
            raise PlanError("cache 'mag' needs the number of inference steps (its ratios are per step).")
        return hooks.MagCacheConfig(mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=steps, **given)
    return hooks.SeaCacheConfig(**given)


def apply_cache(pipe, name: str, threshold: float | None = None, *, steps: int | None = None):
    """Enable the cache `name` on `pipe.transformer`; returns the config."""
    config = make_config(pipe, name, threshold, steps)
    pipe.transformer.enable_cache(config)
    return config
