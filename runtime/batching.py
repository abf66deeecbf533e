"""Automatic pipelining: many concurrent callers, one Redis round trip.

Activations of different entities run concurrently and each needs a load and a
commit. Sent one by one, every command costs a round trip and ~100 us of client
CPU. :class:`AutoPipeline` queues the commands issued while a pipeline is in
flight and sends them together in the next one, so throughput grows with load
while an idle system still answers in a single round trip.

Its drain and send tasks are started by whichever caller comes first, so no
task group encloses them: an :class:`~wakeful.tasks.OwnedTasks` owns them, and
a caller whose command never went out (the drain was cancelled) gets the
error instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from .tasks import OwnedTasks

log = logging.getLogger("wakeful.batching")
Stage = Callable[[Pipeline], object]


class AutoPipeline:
    def __init__(self, redis: Redis, *, max_batch: int = 256, max_in_flight: int = 2) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._queue: list[tuple[Stage, asyncio.Future[Any]]] = []
        self._slots = asyncio.Semaphore(max_in_flight)
        self._draining = False
        self._tasks = OwnedTasks(log)

    async def execute(self, stage: Stage) -> Any:
        """Queue the commands ``stage`` adds to a pipeline; return the reply (a list of
        replies if it added several). The first error among them is raised."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((stage, future))
        if not self._draining:
            self._draining = True
            self._tasks.start(self._drain(), name="wakeful-pipeline-drain")
        return await future

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let the other callers of this tick queue up
            while self._queue:
                await self._slots.acquire()
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                self._tasks.start(self._send(batch), name="wakeful-pipeline-send")
        except BaseException as exc:  # cancelled: the queued callers must not wait forever
            queued, self._queue = self._queue, []
            for _, future in queued:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
            raise
        finally:
            self._draining = False

    async def _send(self, batch: list[tuple[Stage, asyncio.Future[Any]]]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            spans: list[tuple[int, int]] = []
            for stage, _ in batch:
                start = len(pipe.command_stack)
                stage(pipe)
                spans.append((start, len(pipe.command_stack)))
            flat = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # connection errors fail every caller of the batch
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), (start, end) in zip(batch, spans, strict=True):
                if future.done():
                    continue
                replies = flat[start:end]
                error = next((r for r in replies if isinstance(r, Exception)), None)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(replies[0] if end - start == 1 else replies)
        finally:
            self._slots.release()
