"""Automatic pipelining: many concurrent callers, one Redis round trip.

Activations of different entities run concurrently and each needs a load and a
commit. Sent one by one, every command costs a round trip and ~100 us of client
CPU. :class:`AutoPipeline` queues the commands issued while a pipeline is in
flight and sends them together in the next one, so throughput grows with load
while an idle system still answers in a single round trip.

The first caller of a loop tick schedules a flush (a callback, not a task: an idle
system's lone command pays no task switch for it); the flush sends what queued up
in that tick, at most ``max_in_flight`` batches at once, and a send that ends
flushes again. A batch of :class:`Commands` only (the scripts: their replies need
no parsing) is written straight to a connection that the auto-pipeline keeps between
sends (one: a second batch in flight borrows another from the pool and gives it
back). A redis-py pipeline built for every batch, parsing each reply by its
command's callback, and the pool's queue taken for every batch, cost about a third
of a lone command's client CPU. Any other stage goes through a redis-py pipeline.

The send tasks are started by whichever caller comes first, so no task group
encloses them: an :class:`~wakeful.tasks.OwnedTasks` owns them, and a caller whose
command never went out (its send was cancelled) gets the error instead of waiting
forever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from .connection import HiredisPackingConnection, closed_by_server
from .tasks import OwnedTasks

log = logging.getLogger("wakeful.batching")
Stage = Callable[[Pipeline], object]
_Queued = tuple[Stage, "asyncio.Future[Any]"]


class Commands:
    """Plain commands whose replies are used as Redis sent them (``EVALSHA``,
    ``WAIT``): a stage the auto-pipeline sends without a redis-py pipeline, and which
    any pipeline can stage too (a cluster's, see ``routing.py``)."""

    __slots__ = ("commands", "keep_errors")

    def __init__(self, *commands: tuple[Any, ...], keep_errors: bool = False) -> None:
        self.commands = commands
        # The caller gets every reply, in a list, an error reply as its exception
        # (otherwise the first error is raised, and one command's reply is not a list).
        self.keep_errors = keep_errors

    def __call__(self, pipe: Pipeline) -> None:
        for command in self.commands:
            pipe.execute_command(*command)


class AutoPipeline:
    def __init__(self, redis: Redis, *, max_batch: int = 256, max_in_flight: int = 2) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._queue: list[_Queued] = []
        self._flush_due = False
        self._kept: Any = None  # the connection it keeps between sends (see _send_commands)
        self._tasks = OwnedTasks(log)

    async def execute(self, stage: Stage) -> Any:
        """Queue the commands ``stage`` adds to a pipeline; return the reply (a list of
        replies if it added several). The first error among them is raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((stage, future))
        if not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)  # after the other callers of this tick
        return await future

    def _flush(self) -> None:
        self._flush_due = False
        while self._queue and self._in_flight < self._max_in_flight:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            self._in_flight += 1
            task = self._tasks.start(self._send(batch), name="wakeful-pipeline-send")
            task.add_done_callback(functools.partial(self._sent, batch))

    def _sent(self, batch: list[_Queued], _: asyncio.Task[None]) -> None:
        """A send ended, however: (one cancelled before it ran never reached its own
        handlers) its callers do not wait for good, and what queued meanwhile goes."""
        _fail(batch, ConnectionError("the pipeline's send was cancelled"))
        self._in_flight -= 1
        if self._queue and not self._flush_due:
            self._flush()

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            if all(isinstance(stage, Commands) for stage, _ in batch):
                flat, spans = await self._send_commands(batch)
            else:
                flat, spans = await self._send_pipeline(batch)
        except BaseException as exc:  # connection errors fail every caller of the batch
            _fail(batch, exc if isinstance(exc, Exception) else ConnectionError())
            if not isinstance(exc, Exception):
                raise
        else:
            for (stage, future), (start, end) in zip(batch, spans, strict=True):
                if future.done():
                    continue
                replies = flat[start:end]
                if isinstance(stage, Commands) and stage.keep_errors:
                    future.set_result(replies)
                    continue
                error = next((r for r in replies if isinstance(r, Exception)), None)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(replies[0] if end - start == 1 else replies)

    async def _send_pipeline(self, batch: list[_Queued]) -> tuple[list[Any], list[tuple[int, int]]]:
        pipe = self._redis.pipeline(transaction=False)
        spans: list[tuple[int, int]] = []
        for stage, _ in batch:
            start = len(pipe.command_stack)
            stage(pipe)
            spans.append((start, len(pipe.command_stack)))
        return await pipe.execute(raise_on_error=False), spans

    async def _send_commands(self, batch: list[_Queued]) -> tuple[list[Any], list[tuple[int, int]]]:
        """What redis-py's pipeline does for commands without reply callbacks: write
        them in one go, read every reply (an error reply is that command's error)."""
        commands: list[tuple[Any, ...]] = []
        spans: list[tuple[int, int]] = []
        for stage, _ in batch:
            assert isinstance(stage, Commands)
            start = len(commands)
            commands += stage.commands
            spans.append((start, len(commands)))
        pool = self._redis.connection_pool
        connection, self._kept = self._kept, None
        if connection is None:
            connection = await pool.get_connection()
        elif closed_by_server(connection):  # what CheckedPool does for a pooled one
            await connection.disconnect()  # it connects again as it sends
        try:
            await connection.send_packed_command(connection.pack_commands(commands))
            if isinstance(connection, HiredisPackingConnection):
                replies = await connection.read_replies(len(commands))
            else:  # TLS, a unix socket, fakeredis: one read (and timeout) per reply
                replies = []
                for _ in commands:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
        except BaseException:
            # Replies may still be on their way: the connection is not used again.
            await connection.disconnect()
            raise
        finally:
            if self._kept is None:
                self._kept = connection
            else:
                await pool.release(connection)
        return replies, spans


def _fail(batch: list[_Queued], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
