"""`dtp serve --replicas R`: R copies of the sharded pipeline, each over world / R ranks, fed by rank 0's one queue.

    layout(world, replicas, cp, cfg) -> (ranks per replica, tp)       PlanError before loading when it does not fit
    replica_mesh(device_type, replicas, cfg, cp, tp) -> this rank's replica mesh (a slice of a ("replica", ...) mesh)
    Router (rank 0)      one thread per other replica: takes a batch from the queue when that replica is idle, sends
                         it to the replica's leader over torchrun's store, answers the jobs with the leader's reply
    Relay (a leader)     the leader's job source for its Lockstep loop: the batches the Router sent, replied to once
                         answered

A streamed image request (`sse`: an event per denoising step) runs on replica 0 only, whose steps rank 0 sees.
Replica k holds ranks k * size ... (k + 1) * size - 1; its first rank is its leader, which runs the lockstep loop
of its replica as rank 0 does for replica 0 (broadcast within the replica's gloo group, agree, log). Routing is by
pulling: replica 0's loop and each Router thread take the next batch only when their replica has nothing running, so
a batch always goes to an idle replica (the least busy), and one batch runs per replica at a time. The store
(torchrun's TCPStore, beside the process groups) carries the requests and the encoded outputs: no collective spans
two replicas after loading, so one replica's long generation never holds another's heartbeat.
"""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..errors import PlanError
from ..runtime.launch import tp_degree
from ..runtime.mesh import CFG_AXIS, CP_AXIS, TP_AXIS
from .batch import batch_key
from .jobs import Job, JobFailed, JobQueue, Progress

REPLICA_AXIS = "replica"
POLL_S = 0.02  # how often a waiting side looks at the store
TAKE_S = 0.25  # how long a Router thread waits on the queue before it looks again whether the server stops
STOP = "stop"


def layout(world: int, replicas: int, cp: int, cfg: int) -> tuple[int, int]:
    """(ranks per replica, tp) for `replicas` replicas of a cfg x cp x tp mesh over `world` ranks."""
    if replicas < 1 or world % replicas:
        raise PlanError(
            f"--replicas {replicas}: must divide the number of processes ({world}); launch a multiple of "
            f"{replicas} ranks or choose a divisor of {world}."
        )
    size = world // replicas
    if replicas == 1:
        return size, tp_degree(world, cp, cfg)  # the message of `dtp serve` without --replicas
    if cp < 1 or cfg < 1 or size % (cp * cfg):
        raise PlanError(
            f"--replicas {replicas} --cp {cp} --cfg {cfg}: each replica has {world} / {replicas} = {size} ranks, "
            f"which cp * cfg = {cp * cfg} must divide; choose fewer replicas or smaller degrees."
        )
    return size, size // (cp * cfg)


def replica_mesh(device_type: str, replicas: int, *, cfg: int, cp: int, tp: int) -> DeviceMesh:
    """This rank's replica mesh: ("cp", "tp"), or ("cfg", "cp", "tp") when cfg > 1, as `dtp.make_mesh` lays it out
    over world / replicas ranks. Every rank builds the whole ("replica", ...) mesh (its groups are created by all
    ranks in one order) and keeps its own slice."""
    names = (CP_AXIS, TP_AXIS) if cfg == 1 else (CFG_AXIS, CP_AXIS, TP_AXIS)
    shape = (cp, tp) if cfg == 1 else (cfg, cp, tp)
    whole = init_device_mesh(device_type, (replicas, *shape), mesh_dim_names=(REPLICA_AXIS, *names))
    return whole[names]


def replica_groups(replicas: int, size: int, new_group) -> list:
    """One gloo group per replica (ranks k * size ...), created by every rank in the same order."""
    return [new_group(ranks=list(range(k * size, (k + 1) * size)), backend="gloo") for k in range(replicas)]


@dataclass
class ReplicaState:
    """What /health says of one replica other than 0 (replica 0's state is `Progress`)."""

    replica: int
    running: int | None = None  # the first job id of the batch it runs, None when idle
    done: int = 0
    failed: int = 0
    batches: int = 0


class Router:
    """Rank 0's side: a thread per replica 1 ... R - 1 that feeds it from `jobs`. Keys: "<replica>/in/<n>" (the
    batch, or STOP) and "<replica>/out/<n>" (the reply)."""

    def __init__(self, store, jobs: JobQueue, replicas: int, *, max_batch: int, batch_wait_s: float, metrics=None):
        self.store = store
        self.jobs = jobs
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.metrics = metrics
        self.states = [ReplicaState(k) for k in range(1, replicas)]
        self._sent = {state.replica: 0 for state in self.states}
        self._lock = threading.Lock()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._feed, args=(state,), name=f"dtp-serve-replica-{state.replica}", daemon=True)
            for state in self.states
        ]

    def start(self) -> Router:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Tell every replica to stop (after its running batch); wait up to `timeout_s` for the running replies."""
        with self._lock:
            self._stopped = True
            for state in self.states:
                self._post(state.replica, STOP)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def health(self, progress: Progress) -> list[dict]:
        """Every replica's state; replica 0's is rank 0's own loop (`progress`)."""
        first = {"replica": 0, "running": progress.job, "done": progress.done, "failed": progress.failed}
        return [{**first, "batches": progress.batches}, *(vars(state).copy() for state in self.states)]

    def _post(self, replica: int, message) -> int:
        self._sent[replica] += 1
        n = self._sent[replica]
        self.store.set(f"{replica}/in/{n}", pickle.dumps(message))
        return n

    def _feed(self, state: ReplicaState) -> None:
        while True:
            batch = self.jobs.get_batch(
                TAKE_S, size=self.max_batch, wait_s=self.batch_wait_s, key=batch_key, only=_reports_no_steps
            )
            with self._lock:
                if self._stopped:
                    for job in batch:
                        if job.record is None:  # a stored job stays queued in the store: it runs after the restart
                            job.future.set_exception(JobFailed("the server is stopping"))
                    return
                if not batch:
                    continue
                if self.metrics is not None:
                    self.metrics.started([time.monotonic() - job.queued_at for job in batch], replica=state.replica)
                for job in batch:
                    if job.on_start is not None:
                        job.on_start()
                state.running = batch[0].id
                n = self._post(state.replica, [(job.id, job.request, job.output) for job in batch])
            self._answer(state, batch, self._reply(state.replica, n))

    def _reply(self, replica: int, n: int):
        key = f"{replica}/out/{n}"
        while not self.store.check([key]):
            time.sleep(POLL_S)
        reply = pickle.loads(self.store.get(key))
        self.store.delete_key(key)
        return reply

    def _answer(self, state: ReplicaState, batch: list[Job], reply) -> None:
        answers, step_seconds = reply
        failed = any(isinstance(answer, str) for answer in answers)
        if self.metrics is not None and step_seconds:
            self.metrics.stepped(step_seconds, replica=state.replica)
        state.failed += len(batch) if failed else 0  # counted before the clients hear: /health agrees with them
        state.done += 0 if failed else len(batch)
        state.batches += 1
        state.running = None
        for job, answer in zip(batch, answers, strict=True):
            if isinstance(answer, str):
                job.future.set_exception(JobFailed(answer))
            else:
                job.future.set_result(answer)


def _reports_no_steps(job: Job) -> bool:
    """A job a replica other than 0 may run: its steps are not reported back, so a streamed one runs on replica 0."""
    return job.on_step is None


class StepRecorder:
    """A leader's `Lockstep.metrics`: keeps the last batch's step seconds for the reply to rank 0."""

    def __init__(self):
        self.step_seconds: list[float] = []

    def started(self, waits: list[float]) -> None:
        self.step_seconds = []

    def stepped(self, step_seconds: list[float]) -> None:
        self.step_seconds = list(step_seconds)


class Relay:
    """A replica leader's job source (`Lockstep.run(relay)`): the next batch rank 0 sent, or STOP (sets
    `stopping`). Once a batch's jobs are all answered, their answers go back under "<replica>/out/<n>"."""

    def __init__(self, store, replica: int, stopping: threading.Event, recorder: StepRecorder):
        self.store = store
        self.replica = replica
        self.stopping = stopping
        self.recorder = recorder
        self._next = 1

    def get_batch(self, timeout: float, **_) -> list[Job]:
        key = f"{self.replica}/in/{self._next}"
        deadline = time.monotonic() + timeout
        while not self.store.check([key]):
            if time.monotonic() > deadline or self.stopping.is_set():
                return []
            time.sleep(POLL_S)
        message = pickle.loads(self.store.get(key))
        self.store.delete_key(key)
        n, self._next = self._next, self._next + 1
        if message == STOP:
            self.stopping.set()
            return []
        batch = [Job(request, job_id, output=output) for job_id, request, output in message]
        answers: dict[int, object] = {}
        lock = threading.Lock()

        def answered(i: int, future) -> None:
            exception = future.exception()
            with lock:
                answers[i] = str(exception) if exception is not None else future.result()
                if len(answers) < len(batch):
                    return
            reply = ([answers[j] for j in range(len(batch))], self.recorder.step_seconds)
            self.store.set(f"{self.replica}/out/{n}", pickle.dumps(reply))

        for i, job in enumerate(batch):
            job.future.add_done_callback(lambda future, i=i: answered(i, future))
        return batch

    def fail_all(self, message: str) -> None:
        """Nothing waits here: rank 0 holds the queue."""


__all__ = [
    "REPLICA_AXIS",
    "Relay",
    "ReplicaState",
    "Router",
    "StepRecorder",
    "layout",
    "replica_groups",
    "replica_mesh",
]
