"""Batching: waiting requests of one shape run as one pipeline call, with one generator per request.

    batch_key(request) -> a hashable key, or None (the request runs alone)
    run_batch(pipe, requests, on_step=...) -> Generation with one output per request, in order

The key holds everything that must be the same in one call: size, frames, steps, guidance and true-CFG scales, the
negative prompt, the LoRA weights and the extra keywords. A request with an input image or `n` > 1 runs alone. The
prompts go in as a list and the generators as a list (diffusers draws each request's latents from its own
generator), so each output is the request's solo run up to the batched matmuls' rounding (fp32: mean |diff| <= 1e-6,
`tests/unit/test_serve_batch.py`). Every rank runs the same batch (rank 0 broadcasts its requests); the cfg axis and
the batch compose (the doubled batch splits over the cfg groups as it does for one request).
"""

from __future__ import annotations

import json

import torch

from ..pipeline.generate import Generation, StepTimer, pixels_of, run_request
from ..pipeline.request import Request, check_request, pipe_kwargs


def batch_key(request: Request):
    """What a request shares with the ones it may run with; None when it runs alone."""
    if request.n != 1 or request.image is not None:
        return None
    lora = None if request.lora is None else tuple(sorted(request.lora.items()))
    extra = json.dumps(request.extra, sort_keys=True, default=repr)
    scales = (request.guidance_scale, request.true_cfg_scale, request.negative_prompt)
    return (request.height, request.width, request.frames, request.steps, *scales, lora, extra)


@torch.no_grad()
def run_batch(pipe, requests: list[Request], *, on_step=None) -> Generation:
    """One pipeline call for `requests` (of one `batch_key`); one request is `run_request` itself."""
    if len(requests) == 1:
        return run_request(pipe, requests[0], on_step=on_step)
    first = requests[0]
    keys = {batch_key(r) for r in requests}
    if len(keys) != 1 or None in keys:
        raise ValueError(f"run_batch: {len(requests)} requests of {len(keys)} shapes; batch one shape only.")
    check_request(pipe, first)
    if first.lora is not None:
        pipe.transformer.set_adapters(list(first.lora), weights=list(first.lora.values()))
    kwargs = pipe_kwargs(pipe, first)
    if first.negative_prompt is not None:
        kwargs["negative_prompt"] = [first.negative_prompt] * len(requests)
    timer = StepTimer(pipe, on_step=on_step)
    with timer:
        out = pipe(
            prompt=[r.prompt for r in requests],
            generator=[torch.Generator("cpu").manual_seed(r.seed) for r in requests],
            output_type="np",
            callback_on_step_end=timer.end_step,
            **kwargs,
        )
    outputs, video = pixels_of(out)
    return Generation(outputs=outputs, video=video, step_seconds=timer.seconds)
