"""What each diffusers cache decides from, and on which mesh axes dtp runs it exactly (else a PlanError).

One row per config class diffusers 0.42.1 ships (`diffusers.hooks`), read from its hook's source:

    FirstBlockCacheConfig        skip blocks 1.. when the first block's residual changed < threshold:
                                 a tensor metric -> made global over cp (and cfg's batch split), then agreed
    TaylorSeerCacheConfig        predict attention outputs on a fixed step schedule: a counter, the same on
                                 every rank; state per cache context (cond / uncond)
    PyramidAttentionBroadcastConfig  reuse attention outputs on a schedule of calls and timesteps; one state
                                 per attention shared by the cond and uncond calls (the uncond call reuses the
                                 cond call's output), so two-call cfg runs both calls on every cfg group
    MagCacheConfig               skip blocks while the product of calibrated per-step ratios stays close
                                 to 1: a schedule, per cache context; calibration measures the ratios (their
                                 token mean made global over cp)
    FasterCacheConfig            attention reused on a schedule; with a doubled batch it also skips the
                                 unconditional half and rebuilds it from the cached one: refused on cfg
    SeaCacheConfig               a spectral indicator of the model's raw latents (whole on every cp rank, gathered
                                 over cfg's batch split; `sea.py`), the gate agreed; fail-open (never skips) on
                                 DTensor or FSDP-managed blocks: refused on tp and with fsdp
    TextKVCacheConfig            hooks NucleusMoE-Image's blocks only (not verified sharded) and keys cached text K/V
                                 by the `data_ptr()` of encoder_hidden_states: refused everywhere

`refusal(config, parallelism)` is the one home of these rules; dtp's `enable_cache` and `prepare` ask it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError


@dataclass(frozen=True)
class CacheKind:
    """One diffusers cache config: the short name (`dtp run --cache`), what its decision reads, and the axes
    (of "tp", "cp", "cfg", and "fsdp" for a model sharded with fsdp=True) on which dtp refuses it, with the reason."""

    name: str
    decides: str
    refused: tuple[tuple[str, str], ...] = ()


# diffusers 0.42.1 hooks TextKVCache into NucleusMoEImageTransformerBlock only; dtp's nucleusmoe plan has not been
# verified with it.
_TEXT_KV = (
    "it only hooks NucleusMoE-Image's blocks (not verified on a sharded one), and keys its K/V by "
    "encoder_hidden_states.data_ptr(), which CP's cut and the cfg wrapper's copies renew every call"
)

KINDS = {
    "FirstBlockCacheConfig": CacheKind("fbc", "first block's residual change (metric reduced over cp, agreed)"),
    "TaylorSeerCacheConfig": CacheKind("taylorseer", "a fixed step schedule (a counter per cache context)"),
    "PyramidAttentionBroadcastConfig": CacheKind("pab", "a schedule of calls and timesteps (one state per attention)"),
    "MagCacheConfig": CacheKind("mag", "calibrated per-step ratios (a schedule); calibration reduced over cp"),
    "FasterCacheConfig": CacheKind(
        "faster",
        "a schedule; the uncond branch approximated from the cond one inside a doubled batch",
        (("cfg", "it splits the doubled batch into uncond/cond itself and reuses the uncond branch across steps"),),
    ),
    "SeaCacheConfig": CacheKind(
        "sea",
        "a spectral indicator of the whole raw latents (gathered over cfg's batch split, checked over cp), agreed",
        (
            ("tp", "diffusers runs it fail-open on blocks with DTensor parameters: nothing is ever skipped"),
            ("fsdp", "diffusers runs it fail-open on FSDP-managed blocks: nothing is ever skipped"),
        ),
    ),
    "TextKVCacheConfig": CacheKind(
        "textkv",
        "cached text K/V keyed by encoder_hidden_states.data_ptr()",
        tuple((axis, _TEXT_KV) for axis in ("tp", "cp", "cfg", "fsdp")),
    ),
}


def kind_of(config) -> CacheKind:
    """The row of `config`'s class; PlanError for a config dtp does not know."""
    kind = KINDS.get(type(config).__name__)
    if kind is None:
        raise PlanError(
            f"enable_cache({type(config).__name__}): not a cache config dtp knows; known: {', '.join(sorted(KINDS))}."
        )
    return kind


def refusal(config, degrees: dict[str, int]) -> str | None:
    """Why `config` cannot run exactly on a mesh of these axis degrees (`{"tp": 2, "cp": 1, "cfg": 1}`), or None."""
    kind = kind_of(config)
    for axis, why in kind.refused:
        if degrees.get(axis, 1) > 1:
            what = f"{type(config).__name__} ({kind.name}) on {axis}={degrees[axis]}"
            fix = "fsdp=False" if axis == "fsdp" else f"{axis}=1"
            return f"{what}: {why}. Use {fix} or another cache."
    return None


def check_config(config, degrees: dict[str, int]) -> None:
    """PlanError (nothing changed) when `config` cannot run exactly on this mesh."""
    why = refusal(config, degrees)
    if why is not None:
        raise PlanError(why)
