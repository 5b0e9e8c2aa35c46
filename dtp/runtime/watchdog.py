"""Name the stuck rank: every rank posts its progress to a shared store; a thread says who is behind.

A rank blocked in a collective cannot tell which peer it waits for: gloo and NCCL time out naming
the collective, not the rank that never joined it. So each rank posts `"<count> <stage>"` under its
rank number each time it moves on ("loading", "transformer call 7", ...), and a daemon thread on
every rank watches its own progress. When this rank has not moved for `stall_s` seconds, the thread
reads every rank's post and logs the ranks that are behind it, e.g.

    dtp run: rank 0 has waited 60 s at 'transformer call 12' (step 13); behind it: rank 1 at 'loading the
    pipeline' (step 1) (still working there, stuck, or dead: their logs say which).

A rank that is itself behind (others moved on) says so; when every rank is at the same stage, all
wait inside one collective (a dead or hung peer, or the network), and the message says that. The
main thread may be blocked in C++ (the collective releases the GIL), hence a thread of its own.
"""

from __future__ import annotations

import sys
import threading
import time


class Watching:
    """`with` it: `self._watch` runs on a daemon thread until the block ends (`_watch` polls `self._stop`, which the
    subclass creates with `self._thread = None`). The one thread machinery of dtp run's progress watchdog and dtp
    serve's peer-failure watcher."""

    thread_name = "dtp-watch"

    def __enter__(self):
        self._thread = threading.Thread(target=self._watch, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Progress(Watching):
    """`post(stage)` as this rank moves on; `with progress:` runs the watching thread."""

    thread_name = "dtp-progress"

    def __init__(self, store, rank: int, world_size: int, *, stall_s: float, log=None):
        self.store = store  # a torch.distributed Store shared by all ranks (keys: rank numbers)
        self.rank = rank
        self.world_size = world_size
        self.stall_s = stall_s
        self.log = log or _stderr
        self.count = 0
        self.stage = "started"
        self._moved = time.monotonic()
        self._reported = -1  # the count at which the last stall was logged (once per stall)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def post(self, stage: str) -> None:
        self.count += 1
        self.stage = stage
        self._moved = time.monotonic()
        self.store.set(str(self.rank), f"{self.count} {stage}")

    def posts(self) -> dict[int, tuple[int, str]]:
        """`{rank: (count, stage)}`; a rank that never posted is `(0, "not started")`."""
        found = {}
        for rank in range(self.world_size):
            key = str(rank)
            if self.store.check([key]):
                count, _, stage = self.store.get(key).decode().partition(" ")
                found[rank] = (int(count), stage)
            else:
                found[rank] = (0, "not started")
        return found

    def stall_message(self) -> str | None:
        """The message to log when this rank has not moved for `stall_s` seconds, else None."""
        waited = time.monotonic() - self._moved
        if waited < self.stall_s:
            return None
        posts = self.posts()
        behind = {r: p for r, p in posts.items() if p[0] < self.count}
        ahead = {r: p for r, p in posts.items() if p[0] > self.count}
        head = f"dtp run: rank {self.rank} has waited {waited:.0f} s at '{self.stage}' (step {self.count})"
        if behind:
            return f"{head}; behind it: {_ranks(behind)} (still working there, stuck, or dead: their logs say which)."
        if ahead:
            return f"{head}, behind the other ranks: {_ranks(ahead)}; they wait for this one."
        return (
            f"{head}; every rank has reached this step, so all wait inside the same collective "
            f"(a dead or hung peer, or the network)."
        )

    def _watch(self) -> None:
        interval = min(max(self.stall_s / 4, 0.05), 5.0)
        while not self._stop.wait(interval):
            if self._reported == self.count:
                continue
            try:
                message = self.stall_message()
            except Exception as error:  # the store went away with its host: nothing more to learn
                message = f"dtp run: rank {self.rank} cannot read the other ranks' progress ({error})."
            if message:
                self._reported = self.count
                self.log(message)


def _ranks(posts: dict[int, tuple[int, str]]) -> str:
    return ", ".join(f"rank {r} at '{stage}' (step {count})" for r, (count, stage) in posts.items())


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
