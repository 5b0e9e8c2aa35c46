"""The queue between rank 0's HTTP thread and the lockstep loop: one job per request, answered once.

A job's `future` resolves to a `Result` (the outputs encoded as `output` asks) or to `JobFailed` (the ranks'
agreed error). A client that disconnects leaves its job in the queue: it still runs on every rank (the ranks never
see a half-cancelled request) and its result is dropped. A job of the video API (`record`: its id in the job
store) can be cancelled while it waits: `get` skips it, no rank ever sees it.
"""

from __future__ import annotations

import collections
import io
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..pipeline.outputs import encode, to_uint8
from ..pipeline.request import Request


class JobFailed(Exception):
    """A generation that raised on at least one rank: the ranks' messages, one per distinct message."""


@dataclass(frozen=True)
class Result:
    outputs: list  # file bytes: PNG per image, MP4 per video
    video: bool
    steps: int
    seconds: float


@dataclass(frozen=True)
class Output:
    """How rank 0 encodes an image: "png", "jpeg" or "webp" at `compression` (0-100, OpenAI's
    output_compression: 100 - compression is the JPEG / WebP quality); a video is always an mp4."""

    format: str = "png"
    compression: int | None = None


def encode_as(pixels, *, video: bool, fps: int, output: Output) -> bytes:
    """The file bytes of one output: an mp4 for a video, else `output.format` (PNG exactly as `dtp run` saves it)."""
    if video or output.format == "png":
        return encode(pixels, video=video, fps=fps)
    from PIL import Image

    buffer = io.BytesIO()
    quality = 100 - output.compression if output.compression is not None else 95
    Image.fromarray(to_uint8(pixels)).save(buffer, format=output.format.upper(), quality=quality)
    return buffer.getvalue()


@dataclass
class Job:
    request: Request
    id: int
    future: Future = field(default_factory=Future)
    output: Output = field(default_factory=Output)
    record: str | None = None  # the job store's id ("video_..."): a job of the video API
    on_start: Callable[[], None] | None = None  # rank 0 calls it as the ranks start the job (the store: in progress)
    on_interrupt: Callable[[str], None] | None = None  # rank 0 calls it when a rank died in the job: the reason
    # rank 0 calls it after each denoising step: (step, steps or None); a streamed request (`sse`). Such a job runs
    # on replica 0 (the others report no steps back)
    on_step: Callable[[int, int | None], None] | None = None
    cancelled: bool = False
    queued_at: float = field(default_factory=time.monotonic)


@dataclass
class Progress:
    """What rank 0 is doing, for GET /health."""

    loaded: bool = False
    job: int | None = None
    record: str | None = None  # the running job's store id, if it has one
    step: int = 0
    steps: int | None = None
    done: int = 0
    failed: int = 0
    batches: int = 0  # pipeline calls (one per batch)


class JobQueue:
    """A bounded FIFO of jobs; `put` refuses beyond `size` waiting (the HTTP answer is then 503). `get_batch` takes
    the first job and the waiting jobs of its batch key (the others keep their order)."""

    def __init__(self, size: int):
        self._waiting: collections.deque[Job] = collections.deque()
        self._ready = threading.Condition()
        self.size = size
        self.records: dict[str, Job] = {}  # store id -> its job, while it waits (a DELETE cancels it here)
        self._ids = itertools.count(1)

    def put(self, request: Request, *, force: bool = False, **options) -> Job | None:
        """A new job (`options`: Job's output, record, on_start), or None when `size` jobs wait already; `force`
        queues it anyway (a job the store accepted before a restart)."""
        with self._ready:
            if not force and len(self._waiting) >= self.size:
                return None
            job = Job(request, next(self._ids), **options)
            self._waiting.append(job)
            self._ready.notify_all()
        return job

    def get(self, timeout: float) -> Job | None:
        """The next job not cancelled, or None after `timeout` seconds without one."""
        batch = self.get_batch(timeout)
        return batch[0] if batch else None

    def get_batch(self, timeout: float, *, size: int = 1, wait_s: float = 0.0, key=None, only=None) -> list[Job]:
        """The next job not cancelled (none after `timeout` seconds) and, up to `size` in all, the waiting jobs whose
        `key(request)` equals its key (not None), waiting up to `wait_s` for more. `only(job)`: take only such jobs
        (a replica other than 0 leaves the streamed ones)."""
        deadline = time.monotonic() + timeout
        wanted = only or (lambda job: True)
        with self._ready:
            first = self._pop(wanted)
            while first is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._ready.wait(remaining)
                first = self._pop(wanted)
            batch = [first]
            shape = key(first.request) if key is not None and size > 1 else None
            if shape is None:
                return batch
            deadline = time.monotonic() + wait_s
            while len(batch) < size:
                same = self._pop(lambda job: wanted(job) and key(job.request) == shape)
                if same is not None:
                    batch.append(same)
                elif not self._ready.wait(max(0.0, deadline - time.monotonic())):
                    break
            return batch

    def _pop(self, wanted) -> Job | None:
        """The first waiting job not cancelled for which `wanted(job)`, removed from the queue (cancelled ones are
        dropped on the way)."""
        for job in list(self._waiting):
            if job.cancelled:
                self._waiting.remove(job)
            elif wanted(job):
                self._waiting.remove(job)
                return job
        return None

    def waiting(self) -> int:
        return len(self._waiting)

    def fail_all(self, message: str) -> None:
        """Answer every waiting job (the server is stopping)."""
        with self._ready:
            jobs, self._waiting = list(self._waiting), collections.deque()
        for job in jobs:
            if job.record is None:  # a stored job stays queued in the store: it runs after the restart
                job.future.set_exception(JobFailed(message))
