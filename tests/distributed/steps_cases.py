"""Shared by the cfg step-path modules: the tiny LTX-2 pipeline with all four passes per step, on K cfg groups.

Each case is the pipeline's call arguments beyond the common ones; the ranks return every case's video frames and
audio (fp32) and the wrapper's counters; the references are diffusers' own pipeline in the pytest process.
"""

from __future__ import annotations

import numpy as np
import torch

from dtp.testing.ltx2_pipeline import LTX2_CALL, LTX2_GUIDANCE, tiny_ltx2_pipeline
from dtp.testing.syncs import StepSyncs

PROMPT, NEGATIVE = "a cat playing a piano", "blurry, low quality"
STEPS = 3  # step 0 learns the step's calls; steps 1 and 2 run its passes over the groups


def guidance_off_after_first_step(pipe, step: int, timestep, callback_kwargs):
    """From step 1 on, no STG and no modality guidance: 4 passes in step 0, 2 (one doubled batch) after."""
    if step == 0:
        pipe._stg_scale = pipe._audio_stg_scale = 0.0
        pipe._modality_scale = pipe._audio_modality_scale = 1.0
    return callback_kwargs


CASES = {
    "ltx2": {},  # classifier-free, spatio-temporal and modality guidance: 3 calls, 4 passes per step
    "ltx2_varying": dict(callback_on_step_end=guidance_off_after_first_step),  # 4 passes in step 0, then 2
}


@torch.no_grad()
def generate(pipe, case: str, **extra) -> tuple[np.ndarray, np.ndarray]:
    """The case's video frames [1, F, H, W, 3] in [0, 1] and its audio, float32, from the same seed on every rank."""
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        **LTX2_CALL,
        **{**LTX2_GUIDANCE, **CASES[case], **extra},
    )
    return np.asarray(out.frames, dtype=np.float32), np.asarray(out.audio, dtype=np.float32)


def count_syncs(pipe) -> tuple[dict[str, float], dict[str, int]]:
    """Host reads per step of steps 2..STEPS of the "ltx2" case (`dtp.testing.syncs`), and the collectives of its
    last step by op (`dtp.analysis.collectives`; on a CPU mesh the host agreements are gloo all-reduces too)."""
    from dtp.analysis.collectives import CollectiveCounter

    marks = []

    def end_step(pipe, step, timestep, callback_kwargs):
        marks.append(counter.counts())
        return syncs.end_step(pipe, step, timestep, callback_kwargs)

    with CollectiveCounter() as counter, StepSyncs(first=1, steps=STEPS) as syncs:
        generate(pipe, "ltx2", callback_on_step_end=end_step)
    assert syncs.steps == STEPS - 1, dict(syncs.counts)
    return syncs.per_step(), dict(marks[-1] - marks[-2])


def references(cases) -> dict:
    return {case: generate(tiny_ltx2_pipeline(), case) for case in cases}


def rank_job(
    rank: int, world: int, runs: list[tuple[dict, list[str]]], control: dict | None, syncs: bool, refusal: bool
) -> dict:
    """Each run's cases on its mesh (`make_mesh` keywords), the VAE whole past 2 ranks (2 latent rows); `control`:
    make_mesh keywords for the negative control (the groups' buffers taken in reverse order); `syncs`: the host
    reads per step of the first run's first case, counted on a second generation; `refusal`: the first run's
    pipeline called with 3 passes per step (no STG), which its cfg degree 2 does not divide."""
    import dtp
    import dtp.runtime.cfg.steps as steps
    from dtp.runtime.cfg import CFG_ATTR, check_predictions

    def sharded(dims: dict):
        pipe = tiny_ltx2_pipeline()
        mesh = dtp.make_mesh(**dims)
        dtp.parallelize_pipeline(pipe, mesh, plans={"vae": None} if mesh.size() > 2 else None)
        return pipe

    out = {}
    for dims, cases in runs:
        for case in cases:
            pipe = sharded(dims)
            out[(tag(dims), case)] = generate(pipe, case)
            check_predictions(pipe.transformer)  # as `dtp run` does: the device-side comparisons, one read
            wrapper = getattr(pipe.transformer, CFG_ATTR)
            out[(tag(dims), case, "stats")] = (vars(wrapper.stats).copy(), vars(wrapper.steps.stats).copy())
            if syncs and (dims, case) == (runs[0][0], runs[0][1][0]):
                out["syncs"] = count_syncs(pipe)
    if refusal:
        out["refusal"] = refused(sharded(runs[0][0]))
    if control is not None:
        real = steps.gather_flat
        steps.gather_flat = lambda *args: real(*args)[::-1]  # each group decodes another group's passes as its own
        try:
            out["control"] = generate(sharded(control), "ltx2")
        finally:
            steps.gather_flat = real
    return out


def refused(pipe) -> tuple[str, int]:
    """The error of a call with 3 passes per step (classifier-free and modality guidance, no STG), and how many
    times the transformer's first block ran before it."""
    block_calls = []
    pipe.transformer.transformer_blocks[0].register_forward_pre_hook(lambda *_: block_calls.append(1))
    try:
        generate(pipe, "ltx2", stg_scale=0.0, audio_stg_scale=0.0)
    except Exception as error:  # noqa: BLE001 - the test checks its type by name (the class differs across imports)
        return f"{type(error).__name__}: {error}", len(block_calls)
    return "no error", len(block_calls)


def tag(dims: dict) -> str:
    """ "cfg=2,tp=2" for make_mesh(cfg=2, tp=2)."""
    return ",".join(f"{k}={v}" for k, v in dims.items())


def errors(result: tuple[np.ndarray, np.ndarray], reference: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """Mean |diff| of the frames and of the audio."""
    return tuple(float(np.abs(a - b).mean()) for a, b in zip(result, reference))
