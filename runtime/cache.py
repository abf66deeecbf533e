"""Warm entity state: skip the snapshot and the log replay when an entity wakes again.

After a commit the worker keeps the folded state of the entity (valid for its
incarnation ``created``, folded up to log position ``pos``), so the next wake
loads only the entries after ``pos``. The cache is an LRU bounded by entity count
(``cache_size``) and by bytes (``cache_max_bytes``, each state's ``nbytes``: an
estimate from its snapshot and the events folded since, taken when it is
remembered). The entity remembered last stays even alone over the byte bound: its
next wake is the likeliest. An evicted entity is reported to ``on_evict`` (the
worker releases its capabilities).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .state import EntityState


@dataclass
class Cached:
    """Warm state of an entity: valid for incarnation ``created``, folded up to ``pos``."""

    state: EntityState
    pos: str
    created: str
    since_snapshot: int
    nbytes: int = 0  # the state's size when it was remembered


class WarmCache:
    def __init__(
        self, size: int, on_evict: Callable[[str], None], max_bytes: int | None = None
    ) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._on_evict = on_evict
        self._entries: OrderedDict[str, Cached] = OrderedDict()
        self.nbytes = 0  # of every entry, as remembered

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, url: str) -> Cached | None:
        return self._entries.get(url)

    def forget(self, url: str) -> None:
        """Drop ``url``'s state: it holds writes that never committed, or is stale."""
        dropped = self._entries.pop(url, None)
        if dropped is not None:
            self.nbytes -= dropped.nbytes

    def remember(self, url: str, state: EntityState, pos: str, created: str, since: int) -> None:
        self.forget(url)
        self._entries[url] = Cached(state, pos, created, since, state.nbytes)
        self.nbytes += state.nbytes
        while len(self._entries) > self._size or (
            self._max_bytes is not None and self.nbytes > self._max_bytes and len(self._entries) > 1
        ):
            evicted, entry = self._entries.popitem(last=False)
            self.nbytes -= entry.nbytes
            self._on_evict(evicted)
