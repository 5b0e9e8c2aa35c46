"""runtime/watchdog.Progress: a rank that stops moving names the ranks behind it (ranks simulated on one store)."""

from __future__ import annotations

import time

import torch.distributed as dist

from dtp.runtime.watchdog import Progress


def _ranks(world_size, stall_s=0.0, log=None):
    store = dist.HashStore()  # shared by the simulated ranks, as torchrun's store is by real ones
    return [Progress(store, r, world_size, stall_s=stall_s, log=log) for r in range(world_size)]


def test_the_ranks_behind_are_named_with_their_stage():
    """Rank 0 reached 'transformer call 1' (step 2); rank 1 is still loading (step 1), rank 2 never posted."""
    ranks = _ranks(3)
    ranks[0].post("loading the pipeline")
    ranks[0].post("transformer call 1")
    ranks[1].post("loading the pipeline")
    message = ranks[0].stall_message()
    assert "rank 0 has waited" in message and "at 'transformer call 1' (step 2)" in message
    assert "rank 1 at 'loading the pipeline' (step 1), rank 2 at 'not started' (step 0)" in message


def test_the_rank_behind_says_it_is_the_one_behind():
    """Measured with torchrun: rank 1 slept in 'loading the pipeline' while rank 0 waited in its first call."""
    ranks = _ranks(2)
    ranks[0].post("loading the pipeline")
    ranks[0].post("transformer call 1")
    ranks[1].post("loading the pipeline")
    message = ranks[1].stall_message()
    assert "behind the other ranks: rank 0 at 'transformer call 1' (step 2); they wait for this one" in message


def test_when_every_rank_reached_the_stage_none_is_blamed():
    ranks = _ranks(2)
    for rank in ranks:
        rank.post("transformer call 3")
    message = ranks[1].stall_message()
    assert "behind" not in message and "all wait inside the same collective" in message


def test_no_message_before_the_stall_time():
    ranks = _ranks(2, stall_s=60)
    ranks[0].post("loading the pipeline")
    assert ranks[0].stall_message() is None


def test_the_watching_thread_logs_a_stall_once():
    """With stall_s = 0.1 s the thread logs within a second, once per stall, naming rank 1."""
    logged: list[str] = []
    ranks = _ranks(2, stall_s=0.1, log=logged.append)
    ranks[1].post("loading the pipeline")
    with ranks[0] as progress:
        progress.post("loading the pipeline")
        progress.post("transformer call 1")
        deadline = time.monotonic() + 5
        while not logged and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second report of the same stall would arrive in this time
    assert len(logged) == 1 and "behind it: rank 1 at 'loading the pipeline'" in logged[0], logged
