"""Reading many entities at once: ``rt.statuses(urls)`` and ``rt.states(urls)``.

The bulk half of :class:`~wakeful.client.Runtime`'s reads: the urls are grouped by
partition and read in pipelines (:meth:`~wakeful.entity_reads.EntityReads.metas_of`,
:meth:`~wakeful.entity_reads.EntityReads.loads`), one round trip per batch of up to
``BULK_BATCH`` entities, instead of one call per entity. An entity that does not
exist is ``None`` in the answer, not an error for the whole batch; a url that is not
an entity url is refused before anything is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .fold import check_skipped, initial_state, rebuild
from .registry import Registry
from .state import EntityState
from .status import EntityStatus, entity_status
from .store import Loaded, Store
from .urls import parse_url


class BulkReads:
    """Statuses and states of many entities (see the module docstring)."""

    registry: Registry

    @property
    def _store(self) -> Store:
        raise NotImplementedError  # the runtime's store

    async def statuses(self, urls: Iterable[str]) -> dict[str, EntityStatus | None]:
        """:meth:`~wakeful.client.Runtime.status` of each of ``urls`` (without runs), by
        url in the order given; ``None`` for an entity that does not exist."""
        wanted = _checked(urls)
        metas = await self._store.metas_of(wanted)
        return {
            url: None if meta is None else entity_status(url, meta)
            for url, meta in zip(wanted, metas, strict=True)
        }

    async def states(self, urls: Iterable[str]) -> dict[str, dict[str, list[Any]] | None]:
        """:meth:`~wakeful.client.Runtime.state` of each of ``urls`` (snapshot + log, as
        plain data), by url in the order given; ``None`` for an entity that does not
        exist. A log that cannot be folded raises, as ``rt.state`` does."""
        wanted = _checked(urls)
        loaded = await self._store.loads(wanted)
        return {
            url: None if one.info is None else fold_loaded(self.registry, url, one).to_builtins()
            for url, one in zip(wanted, loaded, strict=True)
        }


def _checked(urls: Iterable[str]) -> list[str]:
    """The urls, each once, in order; an invalid url refuses the whole call."""
    wanted = list(dict.fromkeys(urls))
    for url in wanted:
        parse_url(url)
    return wanted


def fold_loaded(registry: Registry, url: str, loaded: Loaded) -> EntityState:
    """The committed state of an entity from what :meth:`Store.load` read of it."""
    meta = loaded.info
    assert meta is not None
    collections = registry.get(meta.type).state if meta.type in registry else {}
    state = initial_state(collections, loaded.snapshot, meta.snapshot_out, loaded.chunks, url)
    folded = rebuild(url, state, loaded.entries, meta.cursor)
    if folded.undecodable:  # an unhandled entry: its input is unknown, not skippable
        raise folded.undecodable[0]
    check_skipped(folded.handled_undecodable, folded.records)  # fine only if skipped
    return folded.state
