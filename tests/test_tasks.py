"""Tasks with an owner: no task outlives the call that started it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from wakeful.tasks import OwnedTasks, all_of, first_of

pytestmark = pytest.mark.anyio


async def test_all_of_raises_the_first_failure_as_itself_and_cancels_the_rest():
    ended = asyncio.Event()
    cancelled = []

    async def fails() -> None:
        raise LookupError("boom")

    async def waits() -> None:
        try:
            await ended.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(LookupError, match="boom"):
        await all_of([waits(), fails()])
    assert cancelled == [True]


async def test_first_of_returns_the_work_s_result_and_stops_the_stopper():
    stop = asyncio.Event()
    stopper_ended = []

    async def stopper() -> None:
        try:
            await stop.wait()
        finally:
            stopper_ended.append(True)

    async def work() -> int:
        return 42

    assert await first_of(work(), stopper()) == (True, 42)
    assert stopper_ended == [True]  # awaited to its end, not left running


async def test_first_of_cancels_the_work_when_stopped_and_waits_for_it():
    started, stop = asyncio.Event(), asyncio.Event()
    work_ended = []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            work_ended.append(True)

    async def stopper() -> None:
        await started.wait()
        stop.set()

    assert await first_of(work(), stopper()) == (False, None)
    assert work_ended == [True]


async def test_first_of_raises_the_work_s_failure_as_itself():
    async def work() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await first_of(work(), asyncio.Event().wait())


async def test_first_of_reports_a_stop_even_if_the_work_fails_while_cancelled():
    """A stop is a stop: a work that raises while it is being cancelled (a task group that
    fails in its cleanup) does not turn the stop into its error."""
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise LookupError("failed while cancelled") from None

    async def stopper() -> None:
        await started.wait()

    assert await first_of(work(), stopper()) == (False, None)


def _swallows_one_cancel(swallowed: list[bool]) -> Coroutine[Any, Any, None]:
    """Work that loses the first cancel it gets and goes on, as a task does whose
    ``asyncio.wait_for`` (inside redis-py, on Python 3.11) completes just as the cancel
    comes."""

    async def work() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)

    return work()


async def test_closing_owned_tasks_ends_a_task_that_lost_a_cancel():
    swallowed: list[bool] = []
    owned = OwnedTasks(logging.getLogger("test"))
    task = owned.start(_swallows_one_cancel(swallowed))
    await asyncio.sleep(0)  # it waits now
    async with asyncio.timeout(10) as deadline:  # a close that waited for good is cut here
        await owned.aclose()
    assert not deadline.expired()  # (the old close swallowed the cut and returned)
    assert swallowed and task.cancelled()


async def test_first_of_stops_work_that_lost_a_cancel():
    swallowed: list[bool] = []
    stop = asyncio.Event()
    stop.set()
    async with asyncio.timeout(10):
        finished, result = await first_of(_swallows_one_cancel(swallowed), stop.wait())
    assert (finished, result) == (False, None)
