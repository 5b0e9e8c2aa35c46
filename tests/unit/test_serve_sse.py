"""`stream: true` without a server (`dtp.serve.sse`): the events a streamed job sends, in order, from a thread that
plays the lockstep loop; a replica other than 0 leaves streamed jobs; the bodies refused. The real server with the
official client: `tests/distributed/test_serve.py::test_openai_client_streams_each_step_then_the_image`."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dtp.errors import PlanError
from dtp.pipeline.request import Request
from dtp.serve.api import _openai_fields
from dtp.serve.jobs import JobFailed, JobQueue, Output, Result, encode_as
from dtp.serve.replicas import _reports_no_steps
from dtp.serve.sse import stream_job


def _worker(jobs: JobQueue, steps: int, fail: bool) -> None:
    """The lockstep loop's part: the job's steps, then its answer (an 8 x 4 jpeg, or a failure)."""
    (job,) = jobs.get_batch(5.0)
    for step in range(1, steps + 1):
        job.on_step(step, steps)
    if fail:
        job.future.set_exception(JobFailed("rank 1: RuntimeError: planted"))
    else:
        image = encode_as(np.zeros((4, 8, 3), np.float32), video=False, fps=16, output=job.output)
        job.future.set_result(Result([image], False, steps, 0.0))


def _events(steps: int, *, fail: bool = False) -> list[dict]:
    jobs = JobQueue(4)
    app = FastAPI()

    @app.post("/stream")
    async def stream():
        return stream_job(jobs, Request(prompt="a cat"), Output("jpeg"), prefix="image_generation")

    worker = threading.Thread(target=_worker, args=(jobs, steps, fail))
    worker.start()
    with TestClient(app) as client, client.stream("POST", "/stream") as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = list(answer.iter_lines())
    worker.join()
    kinds = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert kinds == [event["type"] for event in events]
    return events


@pytest.mark.parametrize("steps", [1, 4])
def test_an_event_per_step_then_the_image(steps):
    events = _events(steps)
    assert [e["type"] for e in events] == ["image_generation.progress"] * steps + ["image_generation.completed"]
    assert [(e["step"], e["steps"]) for e in events[:-1]] == [(k, steps) for k in range(1, steps + 1)]
    assert events[-2]["progress"] == 100
    completed = events[-1]
    assert (completed["output_format"], completed["size"], completed["background"]) == ("jpeg", "8x4", "opaque")


def test_a_failed_generation_ends_with_an_error_event():
    events = _events(2, fail=True)
    assert [e["type"] for e in events] == ["image_generation.progress"] * 2 + ["error"]
    assert "planted" in events[-1]["error"]["message"]


def test_a_replica_other_than_0_leaves_streamed_jobs():
    jobs = JobQueue(4)
    streamed = jobs.put(Request(prompt="a", seed=1), on_step=lambda step, steps: None)
    plain = [jobs.put(Request(prompt="b", seed=s)) for s in (2, 3)]
    taken = jobs.get_batch(0.1, size=4, key=lambda r: "same", only=_reports_no_steps)
    assert taken == plain
    assert jobs.get_batch(0.1) == [streamed]  # replica 0 takes it


@pytest.mark.parametrize(
    "body, named",
    [
        ({"stream": True, "partial_images": 2}, "partial_images 2"),
        ({"stream": "yes"}, "stream 'yes'"),
    ],
)
def test_what_a_stream_cannot_have(body, named):
    with pytest.raises(PlanError, match=named):
        _openai_fields({"prompt": "a cat", **body})
    _, taken = _openai_fields({"prompt": "a cat", "stream": True, "partial_images": 0})
    assert taken["stream"] is True
