"""Tasks with an owner: no task outlives the call that started it."""

from __future__ import annotations

import asyncio

import pytest

from wakeful.tasks import all_of, first_of

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
