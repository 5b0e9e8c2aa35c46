"""End every rank soon after one rank's failure has left the others inside a collective.

A rank whose generation raises catches it and waits for the others in the outcome agreement (`Lockstep._agree`).
When it raised in the middle of the sharded transformer or the split VAE, the others are waiting inside a
collective it will never join: nobody reaches the agreement, and without help every rank waits for the process
group's timeout (`--timeout`, 600 s by default) while requests pile up. So a failed rank also posts its failure
to torchrun's store (a store beside the process group: it answers while the group is blocked), and on every rank a
thread watches the running request: when a failure is posted for it and this rank has not agreed `grace_s`
seconds after seeing it, the ranks cannot agree any more. The rank logs one line, e.g.

    dtp serve: rank 0: rank 1 failed request 7 (RuntimeError: ...) and the ranks have not agreed 30 s later
    (the others wait inside a collective it left): every rank ends; restart with torchrun --max-restarts

and calls `give_up` (rank 0 answers the request with a 500 first), which ends the process with exit code 1;
torchrun then ends the other ranks too. A failure outside collectives (post-processing, encoding) is agreed on
well within `grace_s` and the server goes on, as before.
"""

from __future__ import annotations

import sys
import threading
import time

from ..runtime.watchdog import Watching

GRACE_S = 30.0  # the slowest legitimate gap between one rank's failure and the agreement: rank 0 encoding a video
POLL_S = 0.5


class PeerFailures(Watching):
    """Post this rank's failure of request `n`; watch for any rank's failure of the running request."""

    thread_name = "dtp-serve-peers"

    def __init__(self, store, rank: int, world_size: int, *, give_up, grace_s: float | None = None, log=None):
        self.store = store  # a torch.distributed Store shared by all ranks (keys "<request>/<rank>")
        self.rank = rank
        self.world_size = world_size
        self.give_up = give_up  # called once with the message, from the watching thread; ends the process
        self.grace_s = GRACE_S if grace_s is None else grace_s  # read at start: a test's wrapper may lower it
        self.log = log or _stderr
        self._request: int | None = None  # the request this rank runs and has not agreed on yet
        self._seen: float | None = None  # when this rank first saw a failure posted for it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, request: int) -> None:
        self._seen = None
        self._request = request

    def fail(self, message: str) -> None:
        """This rank's generation of the running request raised `message`."""
        self.store.set(f"{self._request}/{self.rank}", message)

    def end(self) -> None:
        """The ranks agreed on the running request: nothing to watch."""
        self._request = None

    def posted(self, request: int) -> dict[int, str]:
        """`{rank: message}` of the failures posted for `request`."""
        keys = {rank: f"{request}/{rank}" for rank in range(self.world_size)}
        return {rank: self.store.get(key).decode() for rank, key in keys.items() if self.store.check([key])}

    def check(self, now: float) -> str | None:
        """The message to give up with, when a failure of the running request is `grace_s` old here; else None."""
        request = self._request
        if request is None:
            return None
        failures = self.posted(request)
        if not failures:
            return None
        if self._seen is None:
            self._seen = now
        if now - self._seen < self.grace_s or request != self._request:
            return None
        named = "; ".join(f"rank {rank} failed request {request} ({message})" for rank, message in failures.items())
        return (
            f"dtp serve: rank {self.rank}: {named} and the ranks have not agreed {self.grace_s:.0f} s later "
            f"(the others wait inside a collective it left): every rank ends; restart with torchrun --max-restarts"
        )

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                message = self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the store went away with rank 0's host: the group ends anyway
                return
            if message:
                self.log(message)
                self.give_up(message)
                return


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
