"""The gateway's event streams: an entity's log and live output as server-sent events.

Each open stream holds a Redis connection while it waits, so :class:`StreamSlots`
caps them in total and per caller, and a :class:`CountedStream` gives its slot
back however the response ends. An event's id is ``<log id>|<live id>``, so a
client resumes both streams with ``Last-Event-ID``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import StreamingResponse

from .client import Runtime
from .connection import CLUSTER_ERRORS, UNREACHABLE_ERRORS
from .errors import HTTPError
from .events import LogRecord, TrimmedRecord, UndecodableRecord, client_view, plain
from .gateway_responses import json_text
from .live import LiveRecord

log = logging.getLogger("wakeful.gateway")


class StreamSlots:
    """Open event streams, counted in total and per caller: each holds a Redis
    connection while it waits, so they are capped below the client's pool."""

    def __init__(self, total: int, per_caller: int) -> None:
        self.total = total
        self.per_caller = per_caller
        self.open: dict[str, int] = {}

    def take(self, caller: str) -> None:
        """Count a new stream of ``caller``, or refuse it with a 503."""
        if sum(self.open.values()) >= self.total:
            raise HTTPError(
                503, "TooManyStreams", f"the gateway serves {self.total} event streams already"
            )
        if self.open.get(caller, 0) >= self.per_caller:
            raise HTTPError(
                503, "TooManyStreams", f"this caller has {self.per_caller} event streams open"
            )
        self.open[caller] = self.open.get(caller, 0) + 1

    def give_back(self, caller: str) -> None:
        left = self.open.get(caller, 0) - 1
        if left > 0:
            self.open[caller] = left
        else:
            self.open.pop(caller, None)


class CountedStream(StreamingResponse):
    """An event stream that gives its slot back when the response ends, however it ends."""

    def __init__(self, stream: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(stream, media_type="text/event-stream")
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def caller_key(identity: dict[str, str] | None, request: Request) -> str:
    """Whose stream this is: the identity, or for an anonymous caller its address."""
    if identity is not None:
        return json.dumps(identity, sort_keys=True)
    return f"anonymous@{request.client.host if request.client else ''}"


async def sse_events(
    runtime: Runtime,
    url: str,
    after: str | None,
    live_after: str | None,
    *,
    live: bool,
    follow: bool,
) -> AsyncIterator[bytes]:
    """The stream's frames. Redis lost once the stream has started (its 200 is sent, too
    late for a 503) ends it with a warning in the log, not a traceback: the client
    resumes with ``Last-Event-ID``. (A follower waits through a lost connection itself.)"""
    frames = _frames(runtime, url, after, live_after, live=live, follow=follow)
    async with contextlib.aclosing(frames):
        try:
            async for frame in frames:
                yield frame
        except (*UNREACHABLE_ERRORS, *CLUSTER_ERRORS) as exc:
            log.warning(
                "gateway: the event stream of %s ended: Redis is unreachable (%s: %s)",
                url,
                type(exc).__name__,
                exc,
            )


async def _frames(
    runtime: Runtime,
    url: str,
    after: str | None,
    live_after: str | None,
    *,
    live: bool,
    follow: bool,
) -> AsyncGenerator[bytes, None]:
    log_pos, live_pos = after or "0-0", live_after or ""
    records = runtime.events(url, after=after, follow=follow, live=live, live_after=live_after)
    async for record in records:
        if isinstance(record, LiveRecord):
            live_pos = record.id
            kind, data = "live", msgspec.to_builtins(record.event)
        elif isinstance(record, LogRecord):
            log_pos = record.id
            event = client_view(record.event)  # full errors: never to clients
            if event is None:
                continue
            kind = str(type(event).__struct_config__.tag)  # events' tags are str
            data = plain(event)
        elif isinstance(record, TrimmedRecord):  # the range before it is gone: say so
            log_pos = record.id
            kind, data = "trimmed", {"upto": record.id, "message": record.message}
        else:
            assert isinstance(record, UndecodableRecord)
            log_pos = record.id
            kind, data = "undecodable", {"error": record.error}
        payload = json_text({"id": record.id, "event": data})
        yield f"id: {log_pos}|{live_pos}\nevent: {kind}\ndata: {payload}\n\n".encode()
