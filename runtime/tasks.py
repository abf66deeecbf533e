"""Tasks with an owner: concurrent calls awaited as one, a race, and background tasks.

:func:`all_of` and :func:`first_of` run tasks inside one ``await``: none outlives
the call, and a failure is raised as itself (callers catch ``FencedError`` or
``WakeInterrupted``, not an exception group).

The auto-pipeline and the idle-notice reader start tasks from plain method calls
made by any number of unrelated callers, so no ``async with`` scope encloses
them. :class:`OwnedTasks` is their owner instead: it keeps a strong reference to
each task until it ends (the event loop keeps only weak ones), retrieves and
logs a failure (nothing is left unretrieved), and cancels what still runs when
its owner closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_RECANCEL_S = 0.05  # how long a cancelled task is waited for before it is cancelled again


async def all_of(calls: list[Coroutine[Any, Any, None]]) -> None:
    """Await ``calls`` concurrently in a task group; the first failure cancels the rest
    and is raised as itself."""
    if len(calls) == 1:
        await calls[0]  # one call: no task needed
        return
    try:
        async with asyncio.TaskGroup() as group:  # cheaper than anyio's per task
            for call in calls:
                group.create_task(call)
    except BaseExceptionGroup as failed:
        raise first_error(failed) from None


def first_error(error: BaseException) -> BaseException:
    """The error a task group failed with: its first leaf that is not a cancellation
    (a group's other tasks are cancelled because of it), raised as itself by callers."""
    if not isinstance(error, BaseExceptionGroup):
        return error
    leaves = [first_error(e) for e in error.exceptions]
    real = [e for e in leaves if not isinstance(e, asyncio.CancelledError)]
    return (real or leaves)[0]


async def first_of(work: Awaitable[T], stop: Awaitable[Any]) -> tuple[bool, T | None]:
    """Await ``work`` unless ``stop`` completes first: ``(True, result)`` if the work
    finished first (its failure is raised as itself), ``(False, None)`` if it was stopped,
    whatever the work then did while it was cancelled (its late failure is retrieved, not
    raised: a stop is a stop). Both are awaited to their end before this returns."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop)
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finished = task.done()
    finally:
        await _cancel_and_wait(stopper)
        if not task.done():
            await _cancel_and_wait(task)
    if not finished:
        return False, None
    return True, task.result()


async def _cancel_and_wait(task: asyncio.Future[Any]) -> None:
    await cancel_until_done([task])
    if not task.cancelled():
        task.exception()  # retrieved: a failure while cancelled is not lost in a warning


async def cancel_until_done(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` until each has ended.

    Once is not always enough: on Python 3.11 an ``asyncio.wait_for`` (redis-py reads
    with one when a socket timeout is set) whose wait completes just as the cancel comes
    returns its result and swallows the cancel, and the task goes on. A closer that
    cancelled once and then awaited the task waited for good (a Ctrl-C that never ended
    the CLI, idle in its teardown). If the caller itself is cancelled meanwhile, that
    cancellation is raised (the tasks have been asked to stop)."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_RECANCEL_S)


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
        """Cancel the tasks that still run until they have ended (see
        :func:`cancel_until_done`); their failures were logged as they ended."""
        await cancel_until_done(list(self._tasks))
