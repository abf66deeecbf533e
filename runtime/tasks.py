"""Background tasks an object starts and owns, for the few places without a task group.

The auto-pipeline and the idle-notice reader start tasks from plain method calls
made by any number of unrelated callers, so no ``async with`` scope encloses
them. :class:`OwnedTasks` is their owner instead: it keeps a strong reference to
each task until it ends (the event loop keeps only weak ones), retrieves and
logs a failure (nothing is left unretrieved), and cancels what still runs when
its owner closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any


class OwnedTasks:
    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coro: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._log.error("background task %s failed", task.get_name(), exc_info=error)

    async def aclose(self) -> None:
        """Cancel the tasks that still run and wait until they have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
