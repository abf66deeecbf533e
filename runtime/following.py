"""Following an entity: its log and live output in time order, until it is idle.

The streaming half of :class:`~wakeful.client.Runtime`: ``Runtime.events`` and
``Runtime.stream_until_idle`` return these generators, bound to the runtime's
store. Reading blocks on one XREAD of both streams (they share a partition); a
follower whose connection is lost or times out reads again from its position.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from .connection import AUTHENTICATION_ERRORS
from .entity_reads import EntityReads
from .errors import EventDecodeError
from .events import LogRecord, TrimmedRecord, UndecodableRecord, decode_entry
from .live import LiveRecord, decode_live
from .store import TRANSIENT_ERRORS
from .streamids import ZERO, id_gt

READ_COUNT = 1000  # entries per stream and read when following an entity
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0  # backoff of a follower whose connection was lost
log = logging.getLogger("wakeful.following")
_LOG, _LIVE = "log", "live"  # the two streams of an entity

Record = LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord


async def follow_entity(
    store: EntityReads,
    url: str,
    *,
    after: str | None,
    follow: bool,
    live: bool,
    live_after: str | None,
    block_ms: int,
) -> AsyncGenerator[Record, None]:
    """See :meth:`wakeful.client.Runtime.events`."""
    log_at = after or ZERO
    live_at = (live_after or await store.newest_live_id(url)) if live else None
    follow = follow or live
    retry_s = RETRY_FIRST_S
    while True:
        _stop_if_cancelled()
        try:
            # Entries before the reader's position may have been trimmed (at the start,
            # or while it lagged): say so, never jump over them silently.
            trimmed = await store.trimmed_upto(url)
            if trimmed is not None and id_gt(trimmed, log_at):
                yield TrimmedRecord(trimmed, log_at)
                log_at = trimmed
            batch = await store.read_entity(url, log_at, live_at, None, READ_COUNT)
            if batch is None and follow:
                _stop_if_cancelled()
                batch = await store.read_entity(url, log_at, live_at, block_ms, READ_COUNT)
        except AUTHENTICATION_ERRORS:
            raise  # refused credentials are a ConnectionError too, but no retry fixes them
        except TRANSIENT_ERRORS as exc:
            if not follow:
                raise
            # A lost or timed-out connection: read again from where we are, for ever.
            log.warning("following %s: %s; resuming after %s", url, exc or type(exc), log_at)
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 2, RETRY_MAX_S)
            continue
        retry_s = RETRY_FIRST_S
        if batch is None:
            if not follow:
                return
            continue
        streams = {_LOG: batch.log, _LIVE: batch.live}
        for stream, entry_id, fields in _merged(streams, _LIVE, READ_COUNT):
            if stream == _LIVE:
                live_at = entry_id
                yield decode_live(entry_id, fields)
                continue
            log_at = entry_id
            try:
                yield decode_entry(entry_id, fields, url)
            except EventDecodeError as exc:
                yield UndecodableRecord(entry_id, exc.reason, fields.get(b"e", b""))


def _stop_if_cancelled() -> None:
    """On Python 3.11 redis-py can swallow a cancellation (an ``asyncio.wait_for`` inside
    its socket reads returns the reply instead): a follower that read on would keep its
    canceller (a task group closing, Ctrl-C at the CLI) waiting for ever. A cancel still
    pending on this task ends the follower at its next read."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def until_idle(
    store: EntityReads,
    url: str,
    records: AsyncIterator[Record],
    *,
    after: str | None,
    idle: Callable[[], Awaitable[object]],
) -> AsyncGenerator[Record, None]:
    """``records`` (the log after ``after`` and live output, following) until ``idle()``
    (a wait for the entity to be idle) returns and every log entry written up to then
    is yielded. See :meth:`wakeful.client.Runtime.stream_until_idle`."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    done = object()
    position: dict[str, str | None] = {"read": after or ZERO, "tail": None}

    async def read() -> None:
        try:
            async for record in records:
                queue.put_nowait(record)
                if isinstance(record, LiveRecord):
                    continue
                position["read"] = record.id
                tail = position["tail"]
                if tail is not None and not id_gt(tail, record.id):
                    break
        except Exception as exc:
            queue.put_nowait(exc)
        queue.put_nowait(done)

    async def watch(reader: asyncio.Task[None]) -> None:
        try:
            await idle()
            last = await store.newest_log_entries(url, 1)
            tail = position["tail"] = last[0][0] if last else ZERO
            if not id_gt(tail, position["read"] or ZERO):
                reader.cancel()
                queue.put_nowait(done)
        except Exception as exc:
            reader.cancel()
            queue.put_nowait(exc)

    # The group owns the reader and the watcher: both end (cancelled if need be)
    # before this generator does. Neither raises; they report through the queue, and
    # a failure is raised here, outside the group, as itself.
    failure: Exception | None = None
    async with asyncio.TaskGroup() as group:
        reader = group.create_task(read(), name=f"stream {url}")
        watcher = group.create_task(watch(reader), name=f"watch {url}")
        try:
            while (item := await queue.get()) is not done:
                if isinstance(item, Exception):
                    failure = item
                    break
                yield item
        except GeneratorExit:
            pass  # the caller stopped early (aclose): the group still ends its tasks
        finally:
            reader.cancel()
            watcher.cancel()
    if failure is not None:
        raise failure


def _merged(
    batches: dict[str, list[tuple[str, dict[bytes, bytes]]]], live_key: str, count: int
) -> list[tuple[str, str, dict[bytes, bytes]]]:
    """Entries of the log and the live stream in time order (by the millisecond of their
    ids). Within one millisecond live output comes first: a step's deltas are written
    before the step is committed.

    A batch of ``count`` entries may have been cut short: entries of the other stream
    later than its last millisecond are left for the next read, which returns the
    rest of the cut stream first.
    """

    def ms(entry_id: str) -> int:
        return int(entry_id.split("-", 1)[0])

    cut = [ms(batch[-1][0]) for batch in batches.values() if len(batch) >= count]
    until = min(cut) if cut else None
    entries = [
        (ms(entry_id), key != live_key, index, key, entry_id, fields)
        for key, batch in batches.items()
        for index, (entry_id, fields) in enumerate(batch)
        if until is None or ms(entry_id) <= until
    ]
    entries.sort(key=lambda e: e[:3])
    return [(key, entry_id, fields) for *_, key, entry_id, fields in entries]
