"""Shared by the cfg parity modules: tiny pipelines generated with the cfg axis, and their one-process references.

Each case is a pipeline builder and its call arguments. The ranks return every image (fp32 pixels in
[0, 1]) and the wrapper's counters; the references are generated once, in the pytest process.
"""

from __future__ import annotations

import numpy as np
import torch

from dtp.families.pipelines import tiny_qwenimage_pipeline
from dtp.testing.cfg_pipelines import PIXART_CALL, WAN_CALL, tiny_pixart_sigma_pipeline, tiny_wan_pipeline

PROMPT, NEGATIVE = "a cat holding a sign that says hello", "blurry, low quality!"  # even lengths: cp=2 splits them
STEPS = 3  # step 0 learns the pair; steps 1 and 2 run it on the two cfg groups
CASES = {
    # two calls per step (true_cfg_scale with a negative prompt), a batch of 1: the pair path
    "qwenimage": (tiny_qwenimage_pipeline, dict(negative_prompt=NEGATIVE, true_cfg_scale=4.0, height=32, width=32)),
    # one call on cat([uncond, cond]) per step: the batch path (batch 2)
    "pixart": (tiny_pixart_sigma_pipeline, dict(guidance_scale=4.5, **PIXART_CALL)),
    # video, two calls per step: the pair path
    "wan": (tiny_wan_pipeline, dict(negative_prompt=NEGATIVE, guidance_scale=5.0, **WAN_CALL)),
    # three prompts without guidance: a batch of 3 over 2 groups (2 + 1 rows)
    "pixart_uneven": (tiny_pixart_sigma_pipeline, dict(guidance_scale=1.0, **PIXART_CALL)),
    # true cfg with 2 images per prompt: each of the two calls has a batch of 2 and is split
    "qwenimage_batch": (
        tiny_qwenimage_pipeline,
        dict(negative_prompt=NEGATIVE, true_cfg_scale=4.0, height=32, width=32, num_images_per_prompt=2),
    ),
}
PROMPTS = {"pixart_uneven": [PROMPT, "a dog", "a red house"]}


@torch.no_grad()
def generate(pipe, case: str) -> np.ndarray:
    """The case's pixels as float32 [..., H, W, 3] in [0, 1], from the same seed on every rank."""
    _, call = CASES[case]
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        prompt=PROMPTS.get(case, PROMPT),
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        **call,
    )
    pixels = out.frames if hasattr(out, "frames") else out.images
    return np.asarray(pixels, dtype=np.float32)


def references(cases) -> dict:
    return {case: generate(CASES[case][0](), case) for case in cases}


def rank_job(rank: int, world: int, runs: list[tuple[dict, list[str]]], swapped: list[str], loaded=None) -> dict:
    """Each run's cases on its mesh (`make_mesh` keywords); `loaded` = (checkpoint, lora): `loaded_job` on the
    first mesh; `swapped` cases once more on the first mesh with the groups' results exchanged the wrong way
    round (the negative control)."""
    import dtp
    import dtp.runtime.cfg.wrapper as wrapper
    from dtp.runtime.cfg import CFG_ATTR

    out = {}
    for dims, cases in runs:
        mesh = dtp.make_mesh(**dims)
        for case in cases:
            pipe = CASES[case][0]()
            dtp.parallelize_pipeline(pipe, mesh)
            out[(tag(dims), case)] = generate(pipe, case)
            out[(tag(dims), case, "stats")] = vars(getattr(pipe.transformer, CFG_ATTR).stats).copy()
    if loaded is not None:
        out["loaded"] = loaded_job(*loaded, runs[0][0])
    real = wrapper.gather_parts
    wrapper.gather_parts = lambda output, *groups: real(output, *groups)[::-1]  # each group takes the other's branch
    try:
        for case in swapped:
            pipe = CASES[case][0]()
            dtp.parallelize_pipeline(pipe, dtp.make_mesh(**runs[0][0]))
            out[("swapped", case)] = generate(pipe, case)
    finally:
        wrapper.gather_parts = real
    return out


def tag(dims: dict) -> str:
    """ "cfg=2,tp=2" for make_mesh(cfg=2, tp=2)."""
    return ",".join(f"{k}={v}" for k, v in dims.items())


# ---- the cfg axis composed with shard-on-load, LoRA and the parallel VAE -------------------------------------

LORA_SCALE = 0.8
LOADED_CASE = "qwenimage"  # its call arguments: true cfg with a negative prompt, two calls per step


def loaded_pipeline(checkpoint, lora, mesh=None, lora_scale: float = LORA_SCALE):
    """The tiny Qwen-Image checkpoint with a LoRA on its transformer at weight `lora_scale`.

    With a mesh: `dtp.load_pipeline` (transformer and text encoder shard-on-load on each cfg group's tp axis,
    the VAE split by rows over all ranks) and dtp's LoRA loader; without: diffusers' own loaders.
    """
    from diffusers import DiffusionPipeline

    import dtp

    if mesh is None:
        pipe = DiffusionPipeline.from_pretrained(checkpoint)
        pipe.load_lora_weights(lora, adapter_name="lora")
    else:
        pipe = dtp.load_pipeline(checkpoint, mesh)
        dtp.load_lora_weights(pipe, lora, adapter_name="lora")
    pipe.transformer.set_adapters("lora", weights=lora_scale)
    return pipe


def loaded_job(checkpoint, lora, dims: dict) -> dict:
    """On the ranks: the loaded pipeline on `make_mesh(**dims)`, its pixels and the cfg wrapper's counters."""
    import dtp
    from dtp.runtime.cfg import CFG_ATTR

    pipe = loaded_pipeline(checkpoint, lora, dtp.make_mesh(**dims))
    return {"pixels": generate(pipe, LOADED_CASE), "stats": vars(getattr(pipe.transformer, CFG_ATTR).stats).copy()}
