"""Shared by the cache parity modules: tiny FLUX.1 with true CFG under diffusers' caches, and what really ran.

`Bodies` counts the runs of each transformer block's and attention module's own forward by patching the
classes' `forward` (diffusers' cache hooks replace an instance's forward and call the class's when they
compute, so a skipped block or attention is not counted; a forward pre-hook would be). Independent of dtp.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from contextlib import contextmanager

import numpy as np
import torch

STEPS = 5
PROMPT, NEGATIVE = "a cat holding a sign that says hello", "blurry, low quality!"
# Qwen-Image keeps each prompt's own token count (164 for PROMPT, 148 for NEGATIVE with its template). PAB hands the
# uncond call the cond call's cached joint attention output, so prompts of different lengths fail in one process:
# "The size of tensor a (148) must match the size of tensor b (164)". This one has PROMPT's 164 tokens.
EVEN_NEGATIVE = "a dog holding a card that says hello"
CALL = dict(negative_prompt=NEGATIVE, true_cfg_scale=4.0, height=32, width=32)  # two calls per step
BLOCKS = 4  # tiny FLUX.1: 2 dual-stream + 2 single-stream blocks, one attention each
UNCACHED = STEPS * 2 * BLOCKS  # blocks (and attentions) one process runs without a cache
# tiny FLUX's relative residual change per step is 0.96-1.5 (cond 0.968, 1.475, 1.252, 1.014; uncond 0.988, ...):
# below 1.0 the first change of each branch skips, the later ones compute.
FBC_THRESHOLD = 1.0
# For the negative control: the cond branch's first change is 0.968082 over the whole image, 0.968219 and 0.967945
# over its two halves (cp=2's ranks): between them, a per-rank metric makes rank 0 compute where one process skips.
SPLIT_THRESHOLD = 0.9681


def config(name: str, pipe, threshold: float = FBC_THRESHOLD):
    """The cache `name` with settings that skip on this 5-step run (TaylorSeer: fp32 factors, exact)."""
    from diffusers import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig, TaylorSeerCacheConfig

    if name == "fbc":
        return FirstBlockCacheConfig(threshold=threshold)
    if name == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, taylor_factors_dtype=torch.float32)
    assert name == "pab"
    return PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 1001),
        current_timestep_callback=lambda: pipe.current_timestep,
    )


@contextmanager
def bodies(model=None):
    """A Counter of real runs: "block" (a child of the model's block lists) and "attention" (an attention module).
    Without a model: tiny FLUX.1's classes (patched before the pipeline is built)."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention
    from diffusers.models.transformers import transformer_flux as flux

    if model is None:
        classes = {flux.FluxTransformerBlock: "block", flux.FluxSingleTransformerBlock: "block"}
        classes[flux.FluxAttention] = "attention"
    else:
        lists = [m for m in model.children() if isinstance(m, torch.nn.ModuleList)]
        classes = {type(block): "block" for blocks in lists for block in blocks}
        kinds = (AttentionModuleMixin, Attention)
        classes |= {type(m): "attention" for m in model.modules() if isinstance(m, kinds)}
    counts = Counter()
    originals = {cls: cls.forward for cls in classes}

    def counting(cls, key):
        @functools.wraps(originals[cls])  # dtp's CP reads block signatures
        def forward(self, *args, **kwargs):
            counts[key] += 1
            return originals[cls](self, *args, **kwargs)

        return forward

    for cls, key in classes.items():
        cls.forward = counting(cls, key)
    try:
        yield counts
    finally:
        for cls, original in originals.items():
            cls.forward = original


@torch.no_grad()
def generate(pipe) -> np.ndarray:
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        prompt=PROMPT,
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        **CALL,
    )
    return np.asarray(out.images, dtype=np.float32)


def cached_run(name: str, mesh=None, before: bool = False, cp_mode: str = "ulysses", **options) -> dict:
    """Pixels and body counts of the tiny FLUX.1 pipeline with the cache `name`, on `mesh` (None: one process).
    `before`: enable_cache before dtp shards the transformer, else after."""
    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    with bodies() as counts:
        pipe = tiny_flux_pipeline()
        if before:
            pipe.transformer.enable_cache(config(name, pipe, **options))
        if mesh is not None:
            dtp.parallelize(pipe.transformer, mesh, cp_mode=cp_mode)
        if not before:
            pipe.transformer.enable_cache(config(name, pipe, **options))
        counts.clear()
        pixels = generate(pipe)
    return {"pixels": pixels, **counts}


def references(names) -> dict:
    """The one-process cached runs, and FirstBlockCache at SPLIT_THRESHOLD for the negative control."""
    return {**{name: cached_run(name) for name in names}, "split": cached_run("fbc", threshold=SPLIT_THRESHOLD)}


MESHES = {"tp=2": (dict(tp=2), "ulysses"), "cp=2": (dict(cp=2), "ulysses"), "ring": (dict(cp=2), "ring")}
MESHES["cfg=2"] = (dict(cfg=2), "ulysses")


def rank_job(rank: int, world: int, runs: list[tuple[str, str, bool]]) -> dict:
    """Each (mesh key, cache name, before) run; then the negative control: FirstBlockCache at cp=2 with its metric
    left per rank (the decision is still agreed, so nothing hangs: the image is what changes)."""
    import dtp
    from dtp.cache import scope

    out = {}
    for key, name, before in runs:
        dims, mode = MESHES[key]
        out[(key, name, before)] = cached_run(name, dtp.make_mesh(**dims), before, mode)
    out["split"] = cached_run("fbc", dtp.make_mesh(cp=2), threshold=SPLIT_THRESHOLD)  # the control, metric global
    out["behind dtp"] = behind_dtp()
    real = scope.DecisionScope.split_groups
    scope.DecisionScope.split_groups = lambda self: []  # each rank's metric over its own tokens only
    try:
        out["per-rank metric"] = cached_run("fbc", dtp.make_mesh(cp=2), threshold=SPLIT_THRESHOLD)
    finally:
        scope.DecisionScope.split_groups = real
    return out


def behind_dtp() -> dict:
    """diffusers' apply_first_block_cache called directly on sharded transformers (cp=2, then cfg=2): the error
    each raises on its first forward, before anything runs."""
    from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache

    import dtp
    from dtp.families.pipelines import tiny_flux_pipeline

    errors = {}
    for key in ("cp=2", "cfg=2"):
        pipe = tiny_flux_pipeline()
        dtp.parallelize(pipe.transformer, dtp.make_mesh(**MESHES[key][0]))
        apply_first_block_cache(pipe.transformer, FirstBlockCacheConfig(threshold=FBC_THRESHOLD))
        try:
            generate(pipe)
            errors[key] = None
        except dtp.ForwardError as error:
            errors[key] = str(error)
    return errors


# ---- other pipelines and caches (priority-2 cases) ----------------------------------------------------------------


def pipelines() -> dict:
    """name -> (builder, call arguments): two-call true CFG (FLUX.1, Qwen-Image, Wan), Qwen-Image with 2 images per
    prompt (each call's batch of 2 is split over cfg=2's groups: the batch path), and one call per step on the
    doubled batch cat([uncond, cond]) (LTX-Video, CogVideoX: the batch path as PixArt-like pipelines take it)."""
    from dtp.families.pipelines import tiny_flux_pipeline, tiny_qwenimage_pipeline
    from dtp.testing.cfg_pipelines import (
        COGVIDEOX_CALL,
        LTX_CALL,
        WAN_CALL,
        tiny_cogvideox_pipeline,
        tiny_ltx_pipeline,
        tiny_wan_pipeline,
    )

    return {
        "flux": (tiny_flux_pipeline, CALL),
        "qwenimage": (tiny_qwenimage_pipeline, CALL),
        "wan": (tiny_wan_pipeline, dict(negative_prompt=NEGATIVE, guidance_scale=5.0, **WAN_CALL)),
        "wan_batch": (
            tiny_wan_pipeline,
            dict(negative_prompt=NEGATIVE, guidance_scale=5.0, num_videos_per_prompt=2, **WAN_CALL),
        ),
        "qwenimage_batch": (tiny_qwenimage_pipeline, dict(num_images_per_prompt=2, **CALL)),
        "qwenimage_even": (tiny_qwenimage_pipeline, {**CALL, "negative_prompt": EVEN_NEGATIVE}),
        "ltx": (tiny_ltx_pipeline, dict(negative_prompt=NEGATIVE, guidance_scale=3.0, **LTX_CALL)),
        "cogvideox": (tiny_cogvideox_pipeline, dict(negative_prompt=NEGATIVE, guidance_scale=3.0, **COGVIDEOX_CALL)),
    }


# Per denoising step without a cache, per pipeline: (transformer blocks, attention modules) run; the calls per step
# times the blocks and attentions of one call. Two-call pipelines: also what both cfg groups run at step 0.
PER_STEP = {
    "flux": {"block": 2 * 4, "attention": 2 * 4},  # 2 dual + 2 single blocks, one attention each
    "qwenimage": {"block": 2 * 2, "attention": 2 * 2},
    "qwenimage_batch": {"block": 2 * 2, "attention": 2 * 2},
    "qwenimage_even": {"block": 2 * 2, "attention": 2 * 2},
    "wan": {"block": 2 * 2, "attention": 2 * 4},  # self and cross attention per block
    "wan_batch": {"block": 2 * 2, "attention": 2 * 4},
    "ltx": {"block": 2, "attention": 4},  # one call per step (doubled batch), attn1 + attn2 per block
    "cogvideox": {"block": 2, "attention": 2},
}
BATCH_PATH = ("qwenimage_batch", "wan_batch", "ltx", "cogvideox")  # calls whose batch cfg=2 splits over its groups
# TaylorSeer's default patterns end in "attn" (re.fullmatch): LTX's attn1 / attn2 need their own.
LTX_ATTENTIONS = (r"^transformer_blocks\.\d+\.attn\d$",)
WAN_ATTENTIONS = (r"^blocks\.\d+\.attn\d$",)  # Wan's attn1 / attn2 likewise


def any_config(name: str, pipe, **options):
    """`config` for the first three; MagCache (calibration with `calibrate=True`, else FLUX's ratios), FasterCache
    (two-call mode unless `doubled`: then diffusers' default, the uncond half of the doubled batch approximated)."""
    from diffusers import FasterCacheConfig, MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    if name == "mag":
        if options.get("calibrate"):
            return MagCacheConfig(calibrate=True, num_inference_steps=STEPS)
        return MagCacheConfig(mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=STEPS, threshold=0.3, retention_ratio=0.2)
    if name == "faster":
        if not options.get("doubled"):
            return FasterCacheConfig(
                current_timestep_callback=lambda: pipe.current_timestep, is_guidance_distilled=True
            )
        always = (-1, 1001)  # every timestep of the 5-step CogVideoX run may skip (the defaults start at 681 / 901)
        return FasterCacheConfig(
            current_timestep_callback=lambda: pipe.current_timestep,
            spatial_attention_timestep_skip_range=always,
            unconditional_batch_timestep_skip_range=always,
            tensor_format="BFCHW",  # CogVideoX's output (batch, frames, channels, height, width)
        )
    if name == "sea":
        from diffusers import SeaCacheConfig

        cut = _cut_latents if options.get("cut") else None  # the control: latents as a cut input would give them
        return SeaCacheConfig(threshold=options.get("threshold", 0.25), raw_vision_callback=cut)
    if name == "taylorseer" and (options.get("ltx") or options.get("wan")):
        from diffusers import TaylorSeerCacheConfig

        names = LTX_ATTENTIONS if options.get("ltx") else WAN_ATTENTIONS
        return TaylorSeerCacheConfig(**{**vars(config(name, pipe)), "cache_identifiers": names})
    return config(name, pipe, **{k: v for k, v in options.items() if k == "threshold"})


def _cut_latents(module, args, kwargs) -> list:
    """Wan's raw vision latents (one per sample), this rank's half of their width only."""
    import torch.distributed as dist
    from diffusers.hooks.sea_cache import _prepare_wan_t2v_raw_vision_metadata as wan_latents

    return [latent.chunk(2, dim=-1)[dist.get_rank() % 2] for latent in wan_latents(module, args, kwargs)]


@torch.no_grad()
def pipeline_run(pipeline: str, name: str, mesh=None, cp_mode: str = "ulysses", fsdp: bool = False, **options) -> dict:
    """Pixels and body counts of a tiny pipeline with the cache `name` enabled after sharding (None: one process;
    `fsdp`: dtp's fsdp=True); with `calibrate`, also MagCache's calibration ratios."""
    import dtp

    build, call = pipelines()[pipeline]
    pipe = build()
    pipe.set_progress_bar_config(disable=True)
    with bodies(pipe.transformer) as counts:
        if mesh is not None:
            dtp.parallelize(pipe.transformer, mesh, cp_mode=cp_mode, fsdp=fsdp)
        cfg = any_config(name, pipe, **options)
        pipe.transformer.enable_cache(cfg)
        counts.clear()  # the sharding's own checks may run the blocks (on meta tensors)
        ratios = _ratios(pipe.transformer) if options.get("calibrate") else None
        out = pipe(
            prompt=PROMPT,
            num_inference_steps=STEPS,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
            **call,
        )
    pixels = out.frames if hasattr(out, "frames") else out.images
    result = {"pixels": np.asarray(pixels, dtype=np.float32), **counts, "fsdp": _fsdp_modules(pipe.transformer)}
    if ratios is not None:
        result["ratios"] = ratios
    return result


def _fsdp_modules(model) -> int:
    """How many modules FSDP2 sharded (0 without fsdp): the fsdp runs really ran sharded."""
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules())


def _ratios(model) -> list:
    """MagCache calibration: the ratios its tail hook appends each step, captured before the run's end clears them."""
    from diffusers.hooks.mag_cache import MagCacheBlockHook

    seen = []
    for module in model.modules():
        for hook in getattr(getattr(module, "_diffusers_hook", None), "hooks", {}).values():
            if isinstance(hook, MagCacheBlockHook) and hook.is_tail:
                step = hook._perform_calibration_step

                def recording(state, residual, _step=step, _hook=hook):
                    _step(state, residual)
                    seen.append((_hook.state_manager.context.name, state.calibration_ratios[-1]))

                hook._perform_calibration_step = recording
    return seen


def pipeline_job(rank: int, world: int, runs: list) -> dict:
    """Each (pipeline, cache, mesh key, options) run on its mesh. Options for the negative controls: `per_rank`, the
    decision metrics left over each rank's own tokens (DecisionScope reduces over nothing); `no_gather`, SeaCache's
    latents not gathered over cfg's batch split; `cut` (SeaCache, cp): a ForwardError is expected, its text returned;
    `drift`: rank 1's TaylorSeer / PAB counters one call ahead after the first call (`_drift`)."""
    import dtp
    from dtp.cache import scope

    out, real = {}, (scope.DecisionScope.split_groups, scope.DecisionScope.batch_group)
    for pipeline, name, key, options in runs:
        dims, mode = MESHES[key]
        given = dict(options)
        if given.pop("per_rank", False):
            scope.DecisionScope.split_groups = lambda self: []
        if given.pop("no_gather", False):
            scope.DecisionScope.batch_group = lambda self: None
        drift = _drift() if given.pop("drift", False) and rank == 1 else contextlib.nullcontext()
        try:
            with drift:
                out[(pipeline, name, key, tuple(options))] = pipeline_run(
                    pipeline, name, dtp.make_mesh(**dims), mode, **given
                )
        except dtp.ForwardError as error:
            if not given.get("cut"):
                raise
            out[(pipeline, name, key, tuple(options))] = {"error": str(error)}
        finally:
            scope.DecisionScope.split_groups, scope.DecisionScope.batch_group = real
    return out


@contextmanager
def _drift():
    """TaylorSeer's step counter and PAB's call counter one ahead after each hook's first call, as an extra call
    counted on one rank only would leave them (a probe run through the hooks, a retried call): that rank's schedule
    of computed and reused attentions shifts while its peers' does not."""
    from diffusers.hooks.pyramid_attention_broadcast import PyramidAttentionBroadcastHook as Pab
    from diffusers.hooks.taylorseer_cache import TaylorSeerCacheHook as Seer

    measure, pab_forward = Seer._measure_should_compute, Pab.new_forward

    def seer_ahead(self):
        state = self.state_manager.get_state()
        if state.current_step == 0:
            state.current_step = 1
        return measure(self)

    def pab_ahead(self, module, *args, **kwargs):
        output = pab_forward(self, module, *args, **kwargs)
        if self.state.iteration == 1:
            self.state.iteration = 2
        return output

    Seer._measure_should_compute, Pab.new_forward = seer_ahead, pab_ahead
    try:
        yield
    finally:
        Seer._measure_should_compute, Pab.new_forward = measure, pab_forward
