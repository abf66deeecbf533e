"""What a handler sees: :class:`HandlerContext`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .events import Created, Event, LogRecord, Message
from .state import Database


class CancelSignal:
    """Set when the wake must stop: the worker lost the partition or is shutting down."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    async def wait(self) -> str | None:
        await self._event.wait()
        return self.reason

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise asyncio.CancelledError(self.reason)


@dataclass(frozen=True)
class WakeInfo:
    """Why the handler runs: the input events after the entity's cursor, in log order."""

    events: list[LogRecord]

    @property
    def messages(self) -> list[Message]:
        return [r.event for r in self.events if isinstance(r.event, Message)]

    @property
    def created(self) -> Created | None:
        return next((r.event for r in self.events if isinstance(r.event, Created)), None)

    @property
    def kinds(self) -> list[str]:
        return [type(r.event).__struct_config__.tag for r in self.events]  # type: ignore[attr-defined]

    def of_type(self, kind: type[Event]) -> list[Any]:
        return [r.event for r in self.events if isinstance(r.event, kind)]


class HandlerContext:
    """Everything a handler may use during one wake."""

    def __init__(
        self,
        *,
        entity_url: str,
        entity_type: str,
        entity_id: str,
        args: Any,
        wake: WakeInfo,
        first_wake: bool,
        db: Database,
        signal: CancelSignal,
        flush: Callable[[], Awaitable[None]],
    ) -> None:
        self.entity_url = entity_url
        self.entity_type = entity_type
        self.entity_id = entity_id
        self.args = args
        self.wake = wake
        self.first_wake = first_wake
        self.db = db
        self.signal = signal
        self.log = logging.LoggerAdapter(
            logging.getLogger(f"wakeful.entity.{entity_type}"), {"entity": entity_url}
        )
        self._flush = flush

    async def flush(self) -> None:
        """A commit point: make the writes so far durable without ending the wake."""
        await self._flush()

    def __repr__(self) -> str:
        return f"<HandlerContext {self.entity_url} wake={self.wake.kinds}>"
