"""The lockstep loop: every rank runs each request together, one at a time, in the order rank 0 took them.

Rank 0 broadcasts a message over a gloo group (`broadcast_object_list`; a gloo group also beside NCCL,
whose collectives cannot carry Python objects): a request, a heartbeat when the queue stayed empty for
`HEARTBEAT_S` (so that an idle server never reaches the process group's timeout), or stop. Every rank then
generates; each catches its own exception, and an `all_gather_object` of the outcomes makes the ranks agree:
one failed rank fails the request everywhere (one 5xx), and the next request runs. A failure that leaves the
other ranks waiting inside a collective (one rank raising in the middle of the sharded transformer) cannot be
agreed on this way: the failed rank also posts it to torchrun's store, and `peers.PeerFailures` ends every rank
`GRACE_S` after it when the ranks have not agreed (rank 0 answers that request with a 500 first).
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import InvalidStateError
from dataclasses import replace

import torch.distributed as dist

from ..pipeline.generate import run_request
from ..runtime.launch import exit_now
from .jobs import Job, JobFailed, JobQueue, Progress, Result, encode_as

HEARTBEAT_S = 2.0
STOP = "stop"
HEARTBEAT = "heartbeat"
ANSWER_S = 1.0  # how long rank 0 lets the HTTP thread send a last 500 before ending the process
# How long the other ranks wait before ending: torchrun ends every rank as soon as one exits with an error, so a rank
# that gave up first would kill rank 0 before its answer went out (a closed connection instead of the 500, seen
# under load). Rank 0's watcher sees the same posted failure within a poll or two of theirs.
PEER_EXIT_S = 5.0


class Lockstep:
    """The loop of one rank. `default_lora`: the adapter weights of a request that names none."""

    def __init__(self, pipe, group, *, default_lora: dict | None, progress: Progress, stopping, peers=None):
        self.pipe = pipe
        self.group = group  # a gloo group of every rank
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.default_lora = default_lora or None
        self.progress = progress
        self.stopping = stopping  # a threading.Event set by SIGTERM (rank 0 turns it into STOP)
        self.peers = peers  # a PeerFailures whose give_up is `self.give_up` (None on one process)
        self._jobs: JobQueue | None = None
        self._job: Job | None = None  # rank 0: the job running now
        self._number = 0  # requests run so far: the same count on every rank (rank 0's order)

    def run(self, jobs: JobQueue | None) -> None:
        """Until stop: rank 0 takes jobs from `jobs`, the other ranks follow rank 0 (`jobs` None)."""
        self._jobs = jobs
        while True:
            job = None
            if self.rank == 0:
                job = None if self.stopping.is_set() else jobs.get(timeout=HEARTBEAT_S)
                message = STOP if self.stopping.is_set() else (HEARTBEAT if job is None else job.request)
                if job is not None and job.on_start is not None and message != STOP:
                    job.on_start()  # the store marks it in progress (one attempt more) before any rank starts
            message = self._broadcast(message if self.rank == 0 else None)
            if message == STOP:
                return
            if message != HEARTBEAT:
                self._serve(message, job)

    def _broadcast(self, message):
        if self.world == 1:
            return message
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _serve(self, request, job: Job | None) -> None:
        """Generate on this rank, agree with the others, and (rank 0) answer the job and log one line."""
        if self.default_lora is not None and request.lora is None:
            request = replace(request, lora=self.default_lora)
        start = time.perf_counter()
        self._number, self._job = self._number + 1, job
        if self.peers is not None:
            self.peers.begin(self._number)
        outcome, result = self._generate(request, job)
        if outcome is not None and self.peers is not None:
            self.peers.fail(outcome)
        outcomes = self._agree(outcome)
        if self.peers is not None:
            self.peers.end()
        seconds = time.perf_counter() - start
        if self.rank != 0:
            return
        failures = {f"rank {r}: {o}" for r, o in enumerate(outcomes) if o is not None}
        if failures:
            self.progress.failed += 1
            job.future.set_exception(JobFailed("; ".join(sorted(failures))))
        else:
            self.progress.done += 1
            job.future.set_result(replace(result, seconds=seconds))
        status = "failed" if failures else "ok"
        steps = result.steps if result is not None else "-"
        print(f"dtp serve: request {job.id}: {steps} steps, {seconds:.2f} s, {status}", file=sys.stderr, flush=True)
        self.progress.job = self.progress.record = None

    def _generate(self, request, job: Job | None) -> tuple[str | None, Result | None]:
        if job is not None:
            self.progress.job, self.progress.record = job.id, job.record
            self.progress.step, self.progress.steps = 0, request.steps
        try:
            generation = run_request(self.pipe, request, on_step=self._on_step)
            video, fps = generation.video, request.fps
            encoded = [encode_as(p, video=video, fps=fps, output=job.output) for p in generation.outputs] if job else []
        except Exception as error:  # noqa: BLE001 - any failure of this rank's generation is the request's
            return f"{type(error).__name__}: {error}", None
        return None, Result(encoded, generation.video, len(generation.step_seconds), 0.0)

    def give_up(self, message: str) -> None:
        """End this rank (exit code 1): the ranks cannot agree on the running request. Rank 0 answers it first and
        ends; the others wait `PEER_EXIT_S` so that torchrun does not end rank 0 before its answer is sent."""
        if self.rank == 0:
            job = self._job
            if job is not None and job.record is not None and job.on_interrupt is not None:
                job.on_interrupt(message)  # a stored job is re-queued after the restart (up to --max-attempts)
            elif job is not None:
                with contextlib.suppress(InvalidStateError):  # the loop answered it a moment ago
                    job.future.set_exception(JobFailed(message))
            if self._jobs is not None:
                self._jobs.fail_all("the server is stopping: a rank failed inside a collective")
            time.sleep(ANSWER_S)
        else:
            time.sleep(PEER_EXIT_S)
        exit_now(1)

    def _on_step(self, step: int) -> None:
        self.progress.step = step
        if self.progress.steps is None:  # the pipeline's default step count, known once it runs
            self.progress.steps = getattr(self.pipe, "_num_timesteps", None)

    def _agree(self, outcome: str | None) -> list:
        if self.world == 1:
            return [outcome]
        outcomes = [None] * self.world
        dist.all_gather_object(outcomes, outcome, group=self.group)
        return outcomes


def fail_waiting(jobs: JobQueue) -> None:
    jobs.fail_all("the server is stopping")


__all__ = ["HEARTBEAT_S", "JobFailed", "Lockstep", "fail_waiting"]
