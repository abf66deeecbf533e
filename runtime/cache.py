"""Warm entity state: skip the snapshot and the log replay when an entity wakes again.

After a commit the worker keeps the folded state of the entity (valid for its
incarnation ``created``, folded up to log position ``pos``), so the next wake
loads only the entries after ``pos``. The cache is a bounded LRU; an evicted
entity is reported to ``on_evict`` (the worker releases its capabilities).
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


class WarmCache:
    def __init__(self, size: int, on_evict: Callable[[str], None]) -> None:
        self._size = size
        self._on_evict = on_evict
        self._entries: OrderedDict[str, Cached] = OrderedDict()

    def get(self, url: str) -> Cached | None:
        return self._entries.get(url)

    def forget(self, url: str) -> None:
        """Drop ``url``'s state: it holds writes that never committed, or is stale."""
        self._entries.pop(url, None)

    def remember(self, url: str, state: EntityState, pos: str, created: str, since: int) -> None:
        self._entries[url] = Cached(state, pos, created, since)
        self._entries.move_to_end(url)
        while len(self._entries) > self._size:
            evicted, _ = self._entries.popitem(last=False)
            self._on_evict(evicted)
