"""The exactness checks' memo (dtp/resolve/exactness/memo.py): bounded, least recently used dropped first, and
emptied by `dtp.resolve.clear_caches()` so the next check runs the forward again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtp.plan import load_plan
from dtp.resolve import clear_caches, resolve
from dtp.resolve.exactness import flow
from dtp.resolve.exactness.memo import BoundedCache, caches
from dtp.testing.tiny import tiny_model


def _reference_lru(keys: list[int], maxsize: int) -> list[int]:
    """An independent LRU: the last `maxsize` distinct keys by their last use, oldest first."""
    order: list[int] = []
    for key in keys:
        if key in order:
            order.remove(key)
        order.append(key)
    return order[-maxsize:]


@given(st.lists(st.integers(0, 9), max_size=60), st.integers(1, 6))
def test_the_cache_keeps_the_most_recently_used_keys_within_its_bound(keys, maxsize):
    cache = BoundedCache("test", maxsize)
    computed = []
    for key in keys:
        assert cache.get_or_compute(key, lambda key=key: computed.append(key) or key * 10) == key * 10
        assert len(cache) <= maxsize
    assert [k for k in range(10) if k in cache] == sorted(_reference_lru(keys, maxsize))
    # A key is computed again only after it was dropped: never more often than it was used.
    assert all(computed.count(k) <= keys.count(k) for k in set(keys))
    assert cache in caches()  # registered: `clear_caches()` reaches it


def test_clear_caches_makes_the_flow_check_run_again(monkeypatch):
    """The flow check's result is memoized (the second call runs no forward); after `clear_caches()` it runs."""
    model = tiny_model("FluxTransformer2DModel")
    resolved = resolve(load_plan("flux"), model)
    calls = []
    real = flow._first_failure
    monkeypatch.setattr(flow, "_first_failure", lambda *args: calls.append(1) or real(*args))
    clear_caches()
    flow.check_flow(resolved, model, 2)
    flow.check_flow(resolved, model, 2)
    assert len(calls) == 1 and 0 < len(flow._RESULTS) <= flow._RESULTS.maxsize
    clear_caches()
    assert len(flow._RESULTS) == 0 and len(flow._BASELINES) == 0
    flow.check_flow(resolved, model, 2)
    assert len(calls) == 2
