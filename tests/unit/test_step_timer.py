"""StepTimer on CUDA records events and reads them after the generation: no torch.cuda.synchronize in a step.

CUDA is stood in for by a fake event class (this torch is CPU-only); the pipeline is a stub whose transformer is
called twice per step (classifier-free guidance), as the pipelines call it.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dtp.pipeline.generate import StepTimer


class _Event:
    """torch.cuda.Event's surface: record() stamps a counter, elapsed_time() is in milliseconds."""

    clock = [0.0]
    waits = []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self):
        _Event.clock[0] += 250.0  # every mark is 250 ms after the previous one
        self.at = _Event.clock[0]

    def synchronize(self):
        _Event.waits.append(self.at)

    def elapsed_time(self, end):
        return end.at - self.at


def test_cuda_steps_are_timed_by_events_read_after_the_generation(monkeypatch):
    syncs, progress = [], []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(a))
    transformer = torch.nn.Linear(1, 1)
    pipe = SimpleNamespace(device=torch.device("cuda"), transformer=transformer)
    with StepTimer(pipe, on_step=progress.append) as timer:
        for step in range(3):
            transformer(torch.ones(1))
            transformer(torch.ones(1))  # the second call of the step starts nothing
            timer.end_step(pipe, step, None, {})
            assert not _Event.waits and timer.seconds == []  # nothing read while the steps run
    assert syncs == [] and progress == [1, 2, 3]
    assert timer.seconds == [0.25, 0.25, 0.25] and len(_Event.waits) == 3  # each end event waited on once, at exit
