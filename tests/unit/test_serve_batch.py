"""`dtp.serve.batch`: requests of one shape as one pipeline call, one generator per request. On the tiny FLUX.1
pipeline in this process (fp32): each output of a batch of 3 equals the request's solo `run_request` (mean |diff|
<= 1e-6); a batch of one request with another seed differs (the negative control: the generators really are per
request). The batch key: what must match, and what runs alone."""

from __future__ import annotations

import numpy as np
import pytest

from dtp.families.pipelines import tiny_flux_pipeline
from dtp.pipeline.generate import run_request
from dtp.pipeline.request import Request
from dtp.serve.batch import batch_key, run_batch

SIZE, STEPS = 32, 2


@pytest.fixture(scope="module")
def pipe():
    pipeline = tiny_flux_pipeline()
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _request(prompt: str, seed: int, **changes) -> Request:
    return Request(**{"prompt": prompt, "seed": seed, "steps": STEPS, "height": SIZE, "width": SIZE, **changes})


def test_each_output_of_a_batch_equals_its_solo_run(pipe):
    requests = [_request("a cat", 1), _request("a dog", 2), _request("a cat", 3)]
    batched = run_batch(pipe, requests)
    assert len(batched.outputs) == 3 and len(batched.step_seconds) == STEPS
    solos = [run_request(pipe, r).outputs[0] for r in requests]
    for output, solo in zip(batched.outputs, solos, strict=True):
        assert np.abs(output - solo).mean() <= 1e-6
    assert np.abs(solos[0] - solos[2]).mean() > 1e-3  # another seed, another image


def test_the_batch_key():
    base = _request("a cat", 1)
    assert batch_key(base) == batch_key(_request("a dog", 9))  # prompt and seed may differ
    for changed in (
        {"steps": 3},
        {"height": 16},
        {"guidance_scale": 2.0},
        {"lora": {"style": 0.5}},
        {"extra": {"x": 1}},
    ):
        assert batch_key(base) != batch_key(_request("a cat", 1, **changed)), changed
    assert batch_key(_request("a cat", 1, n=2)) is None
    assert batch_key(_request("a cat", 1, image=object())) is None
    with pytest.raises(ValueError, match="one shape"):
        run_batch(None, [base, _request("a cat", 1, steps=3)])
