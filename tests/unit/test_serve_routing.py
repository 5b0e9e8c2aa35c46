"""`serve.replicas`' Router and Relay over an in-process store (no process group, no pipeline): a batch rank 0 takes
reaches the other replica's leader whole, its answers (or its failure) come back to the right jobs, STOP stops the
leader, and a busy replica takes nothing more."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from dtp.pipeline.request import Request
from dtp.serve.jobs import JobFailed, JobQueue, Output, Progress, Result
from dtp.serve.replicas import Relay, Router, StepRecorder

WAIT_S = 10


def _leader(store, stopping, answer):
    """Replica 1's leader: each batch from its Relay answered by `answer(jobs)` until STOP; the batches it saw."""
    recorder = StepRecorder()
    relay, seen = Relay(store, 1, stopping, recorder), []

    def loop():
        while not stopping.is_set():
            batch = relay.get_batch(0.1)
            if batch:
                seen.append([(job.id, job.request.prompt, job.output.format) for job in batch])
                recorder.stepped([0.5, 0.25])
                answer(batch)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread, seen


def _ok(batch):
    for job in batch:
        job.future.set_result(Result([job.request.prompt.encode()], False, 2, 0.1))


def test_a_batch_goes_to_the_other_replica_and_its_answers_come_back():
    store, jobs, stopping = dist.HashStore(), JobQueue(8), threading.Event()
    thread, seen = _leader(store, stopping, _ok)
    router = Router(store, jobs, 2, max_batch=4, batch_wait_s=0.2).start()
    queued = [jobs.put(Request(prompt=f"p{i}", seed=i), output=Output("jpeg")) for i in range(3)]
    assert [job.future.result(WAIT_S).outputs for job in queued] == [[b"p0"], [b"p1"], [b"p2"]]
    assert seen == [[(1, "p0", "jpeg"), (2, "p1", "jpeg"), (3, "p2", "jpeg")]]  # one batch of the three, whole
    health = router.health(Progress(done=4, batches=2))
    assert health == [
        {"replica": 0, "running": None, "done": 4, "failed": 0, "batches": 2},
        {"replica": 1, "running": None, "done": 3, "failed": 0, "batches": 1},
    ]
    router.stop(WAIT_S)
    thread.join(WAIT_S)
    assert stopping.is_set() and not thread.is_alive()  # STOP reached the leader


def test_a_failed_batch_fails_its_jobs_only():
    store, jobs, stopping = dist.HashStore(), JobQueue(8), threading.Event()

    def fail_first(batch):
        if batch[0].request.prompt == "bad":
            for job in batch:
                job.future.set_exception(JobFailed("rank 1: RuntimeError: boom"))
        else:
            _ok(batch)

    thread, _ = _leader(store, stopping, fail_first)
    router = Router(store, jobs, 2, max_batch=1, batch_wait_s=0.0).start()
    bad = jobs.put(Request(prompt="bad"))
    with pytest.raises(JobFailed, match="boom"):
        bad.future.result(WAIT_S)
    good = jobs.put(Request(prompt="good"))
    assert good.future.result(WAIT_S).outputs == [b"good"]
    assert router.health(Progress())[1] | {"running": None} == {
        "replica": 1, "running": None, "done": 1, "failed": 1, "batches": 2,
    }  # fmt: skip
    router.stop(WAIT_S)
    thread.join(WAIT_S)


def test_a_busy_replica_takes_nothing_more():
    """While replica 1 runs a batch, the next job stays in the queue (for replica 0's loop to take)."""
    store, jobs, stopping = dist.HashStore(), JobQueue(8), threading.Event()
    release = threading.Event()

    def slow(batch):
        release.wait(WAIT_S)
        _ok(batch)

    thread, seen = _leader(store, stopping, slow)
    router = Router(store, jobs, 2, max_batch=1, batch_wait_s=0.0).start()
    first = jobs.put(Request(prompt="first"))
    deadline = time.monotonic() + WAIT_S
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert router.health(Progress())[1]["running"] == first.id
    jobs.put(Request(prompt="second"))
    time.sleep(0.3)
    assert jobs.waiting() == 1  # replica 1 is busy: the second job waits
    release.set()
    assert first.future.result(WAIT_S).outputs == [b"first"]
    router.stop(WAIT_S)
    thread.join(WAIT_S)
