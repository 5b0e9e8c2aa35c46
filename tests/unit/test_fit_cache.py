"""`dtp fit --cache`: a step cache's state on one rank, predicted from the full-size-style meta trace, against
torch's MemTracker on a real run (tiny FLUX.1, fp32, true CFG, one process), and rows without --cache unchanged."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline, TaylorSeerCacheConfig

from dtp.families.pipelines import tiny_checkpoint
from dtp.fit.cache_state import state_bytes
from dtp.fit.measure import Measurer
from dtp.fit.pipelines import Shape, fit_pipeline

SIZE, TOKENS, STEPS = 64, 32, 2  # step 1's update makes the order-1 factors: the state is whole from then on
TOL = 0.10  # |measured - predicted| / predicted; measured: equal (589824 B both, 64², 32 text tokens, 2 contexts)


@pytest.fixture(scope="module")
def directory():
    return str(tiny_checkpoint("flux"))


def _peak(pipe, embeds, cache) -> int:
    """MemTracker's peak over one true-CFG generation from prompt embeddings to latents (denoising only)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.modules.module import register_module_forward_pre_hook

    if cache:
        pipe.transformer.enable_cache(TaylorSeerCacheConfig())  # diffusers' defaults: bf16 factors, order 1
    tracker = MemTracker()
    tracker.track_external(pipe.transformer)

    # MemTracker refuses a module called twice per region; only its global peak is read (test_fit_measured.py)
    def forget_module(module, args) -> None:  # returns None: a pre-hook's return value would replace the inputs
        tracker.memory_tracking.pop(module, None)

    forget = register_module_forward_pre_hook(forget_module)
    try:
        with torch.no_grad(), tracker:
            pipe(height=SIZE, width=SIZE, num_inference_steps=STEPS, true_cfg_scale=4.0, output_type="latent", **embeds)
    finally:
        forget.remove()
        if cache:
            pipe.transformer.disable_cache()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def test_taylorseer_state_is_what_memtracker_sees(directory):
    """Peak with TaylorSeer - peak without (a real run) = dtp fit's predicted state, within 10 %. The run uses true
    CFG, so two cache contexts (dtp fit's FLUX.1 rows assume one call per step: contexts = calls_per_step = 1); the
    prediction with one context is half the measured figure (a wrong context count fails)."""
    pipe = FluxPipeline.from_pretrained(directory, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        embeds = {}
        for key, prompt in (("", "a photo of a cat"), ("negative_", "blurry")):
            encoded, pooled, _ = pipe.encode_prompt(prompt, None, max_sequence_length=TOKENS)
            embeds |= {f"{key}prompt_embeds": encoded, f"{key}pooled_prompt_embeds": pooled}
    measured = _peak(pipe, embeds, True) - _peak(pipe, embeds, False)
    measurer = Measurer(fit_pipeline(directory), torch.float32, cache=False)
    predicted = state_bytes("taylorseer", measurer, Shape(1, SIZE, SIZE, 1, TOKENS), contexts=2)
    print(f"TaylorSeer state: measured {measured} B, predicted {predicted} B")
    assert abs(measured - predicted) <= TOL * predicted, (measured, predicted)


def test_fit_rows_gain_the_state_only_with_cache(directory):
    """dtp.fit with cache="taylorseer": each row's denoise and decode phases gain its cache_bytes (halved at cp=2,
    whose ranks hold half the tokens), the text phase and the weights do not; without it the rows are as before."""
    import dtp

    measurer = Measurer(fit_pipeline(directory), torch.float32, cache=False)
    ask = dict(resolution=SIZE, dtype="fp32", text_tokens=TOKENS, only={"tp": 1, "cfg": 1, "fsdp": False})
    plain = dtp.fit(directory, 2, "80GB", measurer=measurer, **ask)["rows"]
    cached = dtp.fit(directory, 2, "80GB", measurer=measurer, cache="taylorseer", **ask)["rows"]
    assert plain and len(plain) == len(cached) and not any("cache" in row for row in plain)
    whole = state_bytes("taylorseer", measurer, Shape(1, SIZE, SIZE, 1, TOKENS), contexts=1)  # FLUX.1: one call
    for before, after in zip(plain, cached):
        extra = after["cache_bytes"]
        assert after["cache"] == "taylorseer" and extra * after["cp"] == whole, (after["cp"], extra, whole)
        assert {p: after["phase_bytes"][p] - b for p, b in before["phase_bytes"].items()} == {
            "text": 0,
            "denoise": extra,
            "decode": extra,
        }
        assert after["weight_bytes"] == before["weight_bytes"] and after["peak_bytes"] >= before["peak_bytes"]
