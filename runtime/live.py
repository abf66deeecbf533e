"""Live output: text deltas and tool progress, outside the durable log.

While a run streams, its text deltas and tool updates go to a short, capped
stream per entity (``<prefix>:{pN}:live:<url>``). Clients follow it to show
tokens as they come and resume from their last id after a disconnect; only
whole messages go to the entity log. Live output is best effort: if Redis
refuses a write the deltas are dropped and the durable log still has the result.

A :class:`LivePublisher` belongs to one wake and has at most one writer task at a
time; the wake closes it (:meth:`LivePublisher.aclose`) before it commits, so no
writer outlives its wake.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import msgspec

log = logging.getLogger("wakeful.live")


class LiveEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A text delta of model step ``step`` of run ``run_id``, a tool's progress update,
    or a call's tool data as the tool sets it (durable later, with the call's result).

    The step tells a follower where a delta belongs even when the live stream and
    the log are read slightly out of order: ids of two streams are only ordered to
    the millisecond, so the next step's first deltas can share a millisecond with
    the previous step's durable ``assistant_step`` and come first.
    """

    kind: Literal["text", "tool_update", "tool_data"]
    data: Any = None
    tool_call_id: str | None = None
    tool: str | None = None
    run_id: str | None = None
    step: int | None = None


class LiveRecord(msgspec.Struct, frozen=True):
    """A live event with its id in the live stream."""

    id: str
    event: LiveEvent


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(LiveEvent)


def decode_live(entry_id: str, fields: dict[bytes, bytes]) -> LiveRecord:
    return LiveRecord(entry_id, _decoder.decode(fields[b"e"]))


class LivePublisher:
    """Buffers live events of one wake and writes them in order, merging text deltas."""

    def __init__(self, append: Any, url: str) -> None:
        self._append = append  # async (url, [encoded events]) -> None
        self._url = url
        self._buffer: list[LiveEvent] = []
        self._task: asyncio.Task[None] | None = None

    def text(self, delta: str, *, run_id: str | None = None, step: int | None = None) -> None:
        last = self._buffer[-1] if self._buffer else None
        if last is not None and last.kind == "text" and (last.run_id, last.step) == (run_id, step):
            last.data += delta
        else:
            self._push(LiveEvent(kind="text", data=delta, run_id=run_id, step=step))
        self._start()

    def tool_update(self, tool_call_id: str, tool: str, update: Any) -> None:
        self._push(
            LiveEvent(
                kind="tool_update",
                data=msgspec.to_builtins(update),
                tool_call_id=tool_call_id,
                tool=tool,
            )
        )
        self._start()

    def tool_data(self, tool_call_id: str, data: Any) -> None:
        self._push(LiveEvent(kind="tool_data", data=data, tool_call_id=tool_call_id))
        self._start()

    async def drain(self) -> None:
        """Wait until everything published so far is written (called before a commit, so a
        follower sees the deltas of a message before the message itself)."""
        self._start()
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})  # the writer logs its own failures

    async def aclose(self) -> None:
        """Drain, and if the wake is cancelled meanwhile, stop the writer with it."""
        try:
            await self.drain()
        finally:
            if self._task is not None and not self._task.done():
                self._task.cancel()

    def _push(self, event: LiveEvent) -> None:
        self._buffer.append(event)

    def _start(self) -> None:
        if self._buffer and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._buffer:
            batch, self._buffer = self._buffer, []
            try:
                await self._append(self._url, [_encoder.encode(e) for e in batch])
            except Exception as exc:  # best effort: the durable log has the whole message
                log.warning("live output of %s dropped: %s", self._url, exc)
