"""`dtp.serve.peers.PeerFailures`, the rule that ends every rank once a failure has left the others inside a
collective: give up only when a failure is posted for the running request and `grace_s` has passed on this rank
without the ranks agreeing. On a real (in-process) torch store; the clock is passed in."""

from __future__ import annotations

import threading

import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from dtp.serve.peers import PeerFailures

GRACE_S = 5.0


def peers(world_size: int = 3, rank: int = 0, store=None, give_up=None) -> PeerFailures:
    return PeerFailures(
        store or dist.HashStore(), rank, world_size, give_up=give_up or (lambda m: None), grace_s=GRACE_S
    )


def test_a_posted_failure_ends_the_rank_only_after_the_grace():
    store = dist.HashStore()
    failed, waiting = peers(rank=1, store=store), peers(rank=0, store=store)
    for rank in (failed, waiting):
        rank.begin(7)
    failed.fail("RuntimeError: boom")
    assert waiting.check(now=100.0) is None  # first seen now
    assert waiting.check(now=100.0 + GRACE_S - 0.1) is None
    message = waiting.check(now=100.0 + GRACE_S)
    assert message.startswith("dtp serve: rank 0: rank 1 failed request 7 (RuntimeError: boom)"), message
    assert "every rank ends" in message


def test_agreement_or_an_old_failure_never_ends_the_rank():
    store = dist.HashStore()
    failed, waiting = peers(rank=1, store=store), peers(rank=0, store=store)
    failed.begin(3)
    failed.fail("ValueError: earlier request")
    waiting.begin(3)
    assert waiting.check(now=0.0) is None
    waiting.end()  # the ranks agreed (a failure outside collectives): one 500, the server goes on
    assert waiting.check(now=10 * GRACE_S) is None
    waiting.begin(4)  # request 3's failure is not request 4's
    assert waiting.check(now=0.0) is None and waiting.check(now=10 * GRACE_S) is None


@given(failing=st.sets(st.integers(0, 3), min_size=1), waited=st.floats(0, 3 * GRACE_S))
def test_the_message_names_exactly_the_failed_ranks(failing, waited):
    store = dist.HashStore()
    ranks = [peers(world_size=4, rank=r, store=store) for r in range(4)]
    for rank in ranks:
        rank.begin(1)
    for r in failing:
        ranks[r].fail(f"Error{r}: x")
    watcher = ranks[0]
    assert watcher.check(now=0.0) is None
    message = watcher.check(now=waited)
    assert (message is None) == (waited < GRACE_S)
    if message is not None:
        named = {r for r in range(4) if f"rank {r} failed request 1 (Error{r}: x)" in message}
        assert named == failing


def test_the_thread_gives_up_once_with_the_message(monkeypatch):
    monkeypatch.setattr("dtp.serve.peers.POLL_S", 0.01)
    given_up, done = [], threading.Event()
    store = dist.HashStore()
    watcher = PeerFailures(store, 0, 2, give_up=lambda m: (given_up.append(m), done.set()), grace_s=0.05, log=print)
    other = peers(world_size=2, rank=1, store=store)
    with watcher:
        watcher.begin(1)
        other.begin(1)
        other.fail("RuntimeError: stuck")
        assert done.wait(timeout=10)
    assert len(given_up) == 1 and "rank 1 failed request 1 (RuntimeError: stuck)" in given_up[0]
