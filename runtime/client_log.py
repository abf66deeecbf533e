"""Exporting an entity's log: its current entries as JSON-ready records.

The export half of :class:`~wakeful.client.Runtime` (``wakeful export URL``): the
same records the archive exporter of log retention gets (``retention.py``), so an
export and an archive read alike. A log that retention trimmed starts with a
``trimmed`` record naming the last entry gone, never a silent gap.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from .retention import entry_record
from .store import Store
from .streamids import ZERO, id_gt

PAGE = 1000  # entries per read


class LogExport:
    """An entity's current log, as records (see the module docstring)."""

    @property
    def _store(self) -> Store:
        raise NotImplementedError  # the runtime's store

    async def export_log(self, url: str) -> AsyncGenerator[dict[str, Any], None]:
        """The entity's current log, oldest first, as JSON-ready records
        (``{"url", "id", "kind", "event"}``). Where retention trimmed entries the
        reader has not seen, a ``{"kind": "trimmed", "id": <last entry gone>}`` record
        comes first."""
        position = ZERO
        while True:
            trimmed = await self._store.trimmed_upto(url)
            if trimmed is not None and id_gt(trimmed, position):
                yield {"url": url, "id": trimmed, "kind": "trimmed", "after": position}
                position = trimmed
            page = await self._store.read_log(url, position, count=PAGE)
            for entry_id, fields in page:
                yield entry_record(url, entry_id, fields)
            if len(page) < PAGE:
                return
            position = page[-1][0]
