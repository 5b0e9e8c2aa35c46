"""The queue between rank 0's HTTP thread and the lockstep loop: one job per request, answered once.

A job's `future` resolves to a `Result` (the encoded outputs) or to `JobFailed` (the ranks' agreed error).
A client that disconnects leaves its job in the queue: it still runs on every rank (the ranks never see a
half-cancelled request) and its result is dropped.
"""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..pipeline.request import Request


class JobFailed(Exception):
    """A generation that raised on at least one rank: the ranks' messages, one per distinct message."""


@dataclass(frozen=True)
class Result:
    outputs: list  # file bytes: PNG per image, MP4 per video
    video: bool
    steps: int
    seconds: float


@dataclass
class Job:
    request: Request
    id: int
    future: Future = field(default_factory=Future)


@dataclass
class Progress:
    """What rank 0 is doing, for GET /health."""

    loaded: bool = False
    job: int | None = None
    step: int = 0
    steps: int | None = None
    done: int = 0
    failed: int = 0


class JobQueue:
    """A bounded FIFO of jobs; `put` refuses beyond `size` waiting (the HTTP answer is then 503)."""

    def __init__(self, size: int):
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=size)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def put(self, request: Request) -> Job | None:
        with self._lock:
            job = Job(request, next(self._ids))
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            return None
        return job

    def get(self, timeout: float) -> Job | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def fail_all(self, message: str) -> None:
        """Answer every waiting job (the server is stopping)."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            job.future.set_exception(JobFailed(message))
