"""The exactness checks' memo: bounded, named, and clearable in one call (`dtp.resolve.clear_caches()`).

`check_flow` runs a meta forward per (model structure, resolved plan, tp) and the unsharded baseline per
structure; `prepare` is called again for every component, every pipeline load and every `dtp check` /
`dtp fit` candidate, so the results are kept. Kept without a bound they would grow for as long as a process
lives (a server that loads model after model); a least-recently-used bound keeps the hot entries (one model's
plans at a few degrees) and drops the rest. Entries are small (a message or a tuple of shapes): the bound is
about leaks, not bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class BoundedCache:
    """At most `maxsize` entries, the least recently used dropped first; emptied by `clear_caches()`."""

    def __init__(self, name: str, maxsize: int):
        assert maxsize > 0, maxsize
        self.name = name
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        _CACHES.append(self)

    def get_or_compute(self, key: Hashable, compute: Callable[[], object]):
        """The value stored for `key`, else `compute()` stored (and the oldest entry dropped past the bound)."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = compute()
        self._entries[key] = value
        if len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries


_CACHES: list[BoundedCache] = []


def caches() -> tuple[BoundedCache, ...]:
    """Every cache of the resolve package, for reports and tests."""
    return tuple(_CACHES)


def clear_caches() -> None:
    """Forget every memoized exactness result (after editing a model class in place, or to free memory)."""
    for cache in _CACHES:
        cache.clear()
