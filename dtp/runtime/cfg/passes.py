"""The transformer passes per denoising step of a pipeline whose guidance dtp knows, read while it runs.

LTX-2's pipelines (diffusers 0.42.1: LTX2Pipeline, image-to-video, condition, IC-LoRA, HDR-LoRA) decide their
passes from the call's guidance scales, and say so in three properties set before the first transformer call:

    do_classifier_free_guidance      guidance_scale > 1 or audio_guidance_scale > 1   2 passes (one doubled batch)
    do_spatio_temporal_guidance      stg_scale > 0 or audio_stg_scale > 0             + 1 (the STG call)
    do_modality_isolation_guidance   modality_scale > 1 or audio_modality_scale > 1   + 1 (the modality call)

so defaults (3.0, 1.0, 3.0) give 4 passes, `stg_scale=0` 3, CFG alone 2, no guidance 1. The cfg wrapper reads
them at every call (host attributes, no device work) and refuses a degree that does not divide them before the
transformer runs (`check_passes`). Other pipelines: None (their steps are learned as they run, `steps.py`).

The arguments a step's later calls are trusted to pass as predicted, compared on the device and read once per
generation (`steps.Steps.defer` / `check_deferred`), by pipeline: LTX-2's latents (`trusted_rows`, the step path)
and true CFG's timestep (`trusted_pair`, the pair path of Qwen-Image, FLUX.1, Chroma: both calls of a step pass
`timestep / 1000` of one `timestep`, a new object per call, so only a value read could tell them equal).
"""

from __future__ import annotations

import functools
import inspect

from ...errors import PlanError

GUIDANCE = ("do_classifier_free_guidance", "do_spatio_temporal_guidance", "do_modality_isolation_guidance")
# The arguments of LTX-2's STG and modality calls that are rows of the first call's doubled batch by construction:
# the loop passes `latents` (and `audio_latents`) to them and `torch.cat([latents] * 2)` to the first call
# (diffusers 0.42.1 pipeline_ltx2.py, the denoising loop; the same in its image-to-video, condition and LoRA
# variants). A new object each step, so identity cannot vouch for them: the step path compares them on the device
# and reads the result once per generation (`steps.Steps.check_deferred`), not once per step.
TRUSTED_ROWS = frozenset({"hidden_states", "audio_hidden_states"})
# The pair path's: pipelines of these diffusers packages whose `__call__` passes `timestep=timestep / 1000` to every
# transformer call of a step (diffusers 0.42.1: FluxPipeline, its img2img, inpaint, Kontext and ControlNet variants,
# the Qwen-Image pipelines, Chroma), checked in the source once per class, so a pipeline that changes it is not trusted.
TRUSTED_PAIR = frozenset({"timestep"})
PAIR_PACKAGES = ("diffusers.pipelines.flux.", "diffusers.pipelines.qwenimage", "diffusers.pipelines.chroma.")
PAIR_TIMESTEP = "timestep=timestep / 1000"


def guidance_passes(pipe) -> int | None:
    """Passes per step of `pipe`'s current call (see the module docstring), or None when dtp does not know them
    (another pipeline, or no call under way)."""
    if pipe is None or not all(isinstance(getattr(type(pipe), name, None), property) for name in GUIDANCE):
        return None
    try:
        cfg, stg, modality = (bool(getattr(pipe, name)) for name in GUIDANCE)
    except AttributeError:  # the scales are set by __call__: none yet
        return None
    return (2 if cfg else 1) + stg + modality


def trusted_rows(pipe) -> frozenset:
    """The arguments the step path compares on the device only, for `pipe` (TRUSTED_ROWS for LTX-2's pipelines)."""
    known = pipe is not None and all(isinstance(getattr(type(pipe), name, None), property) for name in GUIDANCE)
    return TRUSTED_ROWS if known else frozenset()


def trusted_pair(pipe) -> frozenset:
    """The arguments the pair path compares on the device only, for `pipe` (TRUSTED_PAIR for true CFG's pipelines
    whose `__call__` dtp read, see PAIR_PACKAGES; else none: each is read when it is a new object)."""
    return TRUSTED_PAIR if pipe is not None and _passes_one_timestep(type(pipe).__call__) else frozenset()


@functools.cache
def _passes_one_timestep(call) -> bool:
    """Whether `call` (a pipeline's `__call__`) is diffusers' and passes `timestep / 1000` to its transformer calls."""
    if not getattr(call, "__module__", "").startswith(PAIR_PACKAGES):
        return False
    try:
        source = inspect.getsource(call)
    except (OSError, TypeError):
        return False
    return source.count(PAIR_TIMESTEP) >= 2


def check_passes(pipe, groups: int) -> None:
    """PlanError when `groups` cfg groups do not divide the passes of `pipe`'s current call."""
    passes = guidance_passes(pipe)
    if passes is None or passes % groups == 0:
        return
    divisors = [k for k in range(1, passes + 1) if passes % k == 0]
    raise PlanError(
        f"cfg={groups} does not divide the {passes} transformer passes per step of this {type(pipe).__name__} call "
        f"(classifier-free guidance {pipe.do_classifier_free_guidance}: "
        f"{2 if pipe.do_classifier_free_guidance else 1}, spatio-temporal guidance "
        f"{pipe.do_spatio_temporal_guidance}, modality guidance {pipe.do_modality_isolation_guidance}); "
        f"use cfg in {divisors}, or change the guidance scales (stg_scale=0 drops the STG pass, modality_scale=1 "
        "the modality pass)."
    )
