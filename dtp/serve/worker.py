"""The lockstep loop: every rank runs each batch of requests together, one batch at a time, in the order rank 0 took
them (a batch: the first waiting request and, with --max-batch > 1, the waiting ones of its batch key; `batch`).

Rank 0 broadcasts a message over a gloo group (`broadcast_object_list`; a gloo group also beside NCCL,
whose collectives cannot carry Python objects): the batch's requests, a heartbeat when the queue stayed empty for
`HEARTBEAT_S` (so that an idle server never reaches the process group's timeout), or stop. Every rank then
generates; each catches its own exception, and an `all_gather_object` of the outcomes makes the ranks agree:
one failed rank fails the batch everywhere (a 5xx for each of its requests), and the next batch runs. A failure
that leaves the other ranks waiting inside a collective (one rank raising in the middle of the sharded
transformer) cannot be agreed on this way: the failed rank also posts it to torchrun's store, and
`peers.PeerFailures` ends every rank `GRACE_S` after it when the ranks have not agreed (rank 0 answers the batch's
requests with a 500 first; a stored video job stays in progress and is queued again after the restart).
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import InvalidStateError
from dataclasses import replace

import torch.distributed as dist

from ..runtime.launch import exit_now
from .batch import batch_key, run_batch
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

    def __init__(
        self,
        pipe,
        group,
        *,
        default_lora: dict | None,
        progress: Progress,
        stopping,
        peers=None,
        max_batch: int = 1,
        batch_wait_s: float = 0.0,
        metrics=None,
        label: str = "",
    ):
        self.pipe = pipe
        self.group = group  # a gloo group of every rank of this replica (`replicas`; all ranks without --replicas)
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0  # within the replica: 0 is its leader
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.label = label  # "replica 1: " in the log lines of a replica other than 0
        self.default_lora = default_lora or None
        self.progress = progress
        self.stopping = stopping  # a threading.Event set by SIGTERM (rank 0 turns it into STOP)
        self.peers = peers  # a PeerFailures whose give_up is `self.give_up` (None on one process)
        self._jobs: JobQueue | None = None
        self.max_batch = max_batch  # requests of one batch key run as one pipeline call (`batch`)
        self.batch_wait_s = batch_wait_s  # how long rank 0 waits for more of the first job's key
        self.metrics = metrics  # rank 0: a metrics.Metrics (None: no prometheus_client, or another rank)
        self._batch: list[Job] = []  # rank 0: the jobs running now
        self._number = 0  # requests run so far: the same count on every rank (rank 0's order)

    def run(self, jobs: JobQueue | None) -> None:
        """Until stop: rank 0 takes batches of jobs from `jobs`, the other ranks follow rank 0 (`jobs` None). With
        --replicas, "rank 0" is the replica's leader and a leader other than rank 0 takes them from a
        `replicas.Relay`."""
        self._jobs = jobs
        while True:
            batch = []
            if self.rank == 0:
                if not self.stopping.is_set():
                    batch = jobs.get_batch(HEARTBEAT_S, size=self.max_batch, wait_s=self.batch_wait_s, key=batch_key)
                message = STOP if self.stopping.is_set() else ([job.request for job in batch] or HEARTBEAT)
                if batch and message != STOP and self.metrics is not None:
                    self.metrics.started([time.monotonic() - job.queued_at for job in batch])
                for job in batch if message != STOP else ():
                    if job.on_start is not None:
                        job.on_start()  # the store marks it in progress (one attempt more) before any rank starts
            message = self._broadcast(message if self.rank == 0 else None)
            if message == STOP:
                return
            if message != HEARTBEAT:
                self._serve(message, batch)

    def _broadcast(self, message):
        if self.world == 1:
            return message
        box = [message]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def _serve(self, requests: list, batch: list[Job]) -> None:
        """Generate on this rank, agree with the others, and (rank 0) answer the jobs and log one line."""
        if self.default_lora is not None:
            requests = [replace(r, lora=self.default_lora) if r.lora is None else r for r in requests]
        start = time.perf_counter()
        self._number, self._batch = self._number + 1, batch
        if self.peers is not None:
            self.peers.begin(self._number)
        outcome, results = self._generate(requests, batch)
        if outcome is not None and self.peers is not None:
            self.peers.fail(outcome)
        outcomes = self._agree(outcome)
        if self.peers is not None:
            self.peers.end()
        seconds = time.perf_counter() - start
        if self.rank != 0:
            return
        failures = {f"rank {r}: {o}" for r, o in enumerate(outcomes) if o is not None}
        for job, result in zip(batch, results or [None] * len(batch), strict=True):
            if failures:
                job.future.set_exception(JobFailed("; ".join(sorted(failures))))
            else:
                job.future.set_result(replace(result, seconds=seconds))
        self.progress.failed += len(batch) if failures else 0
        self.progress.done += 0 if failures else len(batch)
        self.progress.batches += 1
        status = "failed" if failures else "ok"
        steps = results[0].steps if results else "-"
        named = f"request {batch[0].id}" if len(batch) == 1 else f"batch of {len(batch)} (requests "
        named += "" if len(batch) == 1 else ", ".join(str(job.id) for job in batch) + ")"
        print(f"dtp serve: {self.label}{named}: {steps} steps, {seconds:.2f} s, {status}", file=sys.stderr, flush=True)
        self.progress.job = self.progress.record = None

    def _generate(self, requests: list, batch: list[Job]) -> tuple[str | None, list[Result] | None]:
        if batch:
            self.progress.job, self.progress.record = batch[0].id, batch[0].record
            self.progress.step, self.progress.steps = 0, requests[0].steps
        try:
            generation = run_batch(self.pipe, requests, on_step=self._on_step)
            if len(generation.outputs) != len(requests) * requests[0].n:
                raise RuntimeError(f"{len(generation.outputs)} outputs for {len(requests)} requests")
            video, steps, results = generation.video, len(generation.step_seconds), []
            if batch and self.metrics is not None:
                self.metrics.stepped(generation.step_seconds)
            for i, job in enumerate(batch):  # rank 0 encodes; request i's outputs are n in a row
                n, fps = requests[i].n, requests[i].fps
                mine = generation.outputs[i * n : (i + 1) * n]
                results.append(
                    Result([encode_as(p, video=video, fps=fps, output=job.output) for p in mine], video, steps, 0.0)
                )
        except Exception as error:  # noqa: BLE001 - any failure of this rank's generation is the batch's
            return f"{type(error).__name__}: {error}", None
        return None, results

    def give_up(self, message: str) -> None:
        """End this rank (exit code 1): the ranks cannot agree on the running request. Rank 0 answers it first and
        ends; the others wait `PEER_EXIT_S` so that torchrun does not end rank 0 before its answer is sent."""
        if self.rank == 0:
            for job in self._batch:
                if job.record is not None and job.on_interrupt is not None:
                    job.on_interrupt(message)  # a stored job is queued again after the restart (--max-attempts)
                else:
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
        for job in self._batch:  # rank 0: a streamed request's event (`sse`)
            if job.on_step is not None:
                # a client's event must never fail the step: rank 0 alone raising would leave the others in a collective
                with contextlib.suppress(Exception):
                    job.on_step(step, self.progress.steps)

    def _agree(self, outcome: str | None) -> list:
        if self.world == 1:
            return [outcome]
        outcomes = [None] * self.world
        dist.all_gather_object(outcomes, outcome, group=self.group)
        return outcomes


def fail_waiting(jobs: JobQueue) -> None:
    jobs.fail_all("the server is stopping")


__all__ = ["HEARTBEAT_S", "JobFailed", "Lockstep", "fail_waiting"]
