"""Transient model errors wait on a durable timer (``model_retry.py``), through the real
anthropic SDK on a mocked transport: 529 with ``retry-after``, an error event
mid-stream, the wait's limit, a cancel and a message during the wait, a missing key."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from tests.agent_apps import events_of
from tests.anthropic_fakes import (
    SSE_HEADERS,
    Server,
    bot_app,
    error_response,
    message_start,
    ok,
    sse,
    stream_body,
    text_block,
)
from tests.apps.harness import until
from tests.faults import crash_and_recover
from wakeful import (
    AssistantStep,
    HandlerContext,
    Registry,
    RunFailedError,
    RunFinished,
)
from wakeful.errors import ModelError
from wakeful.events import HandlerFailed, ModelRetryDue, ModelRetryWait
from wakeful.model_retry import next_wait

pytestmark = pytest.mark.anyio


def app(server: Server, **options: Any) -> Registry:
    reg = bot_app(server, **options)  # the SDK gives up at once (max_retries=0): our turn

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for message in ctx.wake.messages:
            ctx.reply(f"echo: {message.payload}")

    return reg


def answer(text: str) -> httpx2.Response:
    return ok(stream_body(text_block(0, text), stop_reason="end_turn"))


def overloaded(retry_after: str) -> httpx2.Response:
    return error_response(529, "overloaded_error", "Overloaded", **{"retry-after": retry_after})


async def test_a_529_waits_on_a_durable_timer_for_its_retry_after(cluster):
    server = Server(overloaded("1"), answer("Here you are."))
    rt = await cluster.runtime(app(server))

    assert await rt.ask("/bot/b", "Hello?", timeout=30) == "Here you are."

    [wait] = await events_of(rt, "/bot/b", ModelRetryWait)
    assert (wait.attempt, wait.retry_after_s) == (1, 1.0)
    assert wait.due_ms - wait.since_ms == 1000  # the server's retry-after, not a backoff
    assert "HTTP 529 overloaded_error" in wait.error
    [due] = await events_of(rt, "/bot/b", ModelRetryDue)  # the timer fired, as an input
    assert (due.run_id, due.attempt) == (wait.run_id, 1)
    assert await events_of(rt, "/bot/b", HandlerFailed) == []  # no failed wake
    assert len(server.requests) == 2
    assert json.loads(server.requests[0].content) == json.loads(server.requests[1].content)
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.steps) == ("completed", 1)


async def test_the_wait_holds_no_worker_and_the_entity_takes_messages_and_cancel(cluster):
    server = Server(overloaded("30"))
    rt = await cluster.runtime(app(server))
    await rt.send("/bot/b", "Hello?")

    async def waiting() -> list[Any]:
        return await events_of(rt, "/bot/b", ModelRetryWait)

    [wait] = await until(waiting, 20, "the run waits out the 529")
    assert wait.due_ms - wait.since_ms == 30_000

    async def waiting_status() -> Any:  # the wait is a flush; the wake's own commit follows
        status = await rt.status("/bot/b")
        return status if status.status == "waiting" else None

    status = await until(waiting_status, 20, "the wake's commit after the wait")
    assert status.timers == 1  # the durable timer of the retry
    assert status.status == "waiting"  # on its timer, no input left to handle
    assert await events_of(rt, "/bot/b", RunFinished) == []  # the run is open, suspended
    # The worker is free: another entity is served during the wait.
    assert await rt.ask("/echo/e", "ping", timeout=20) == "echo: ping"
    # A message joins the open run and does not cut the wait short.
    await rt.send("/bot/b", "Are you there?")

    async def handled() -> bool:
        status = await rt.status("/bot/b")
        return status.cursor == status.last_input

    await until(handled, 20, "the message is handled")
    assert len(server.requests) == 1  # no model call before the timer
    await rt.cancel("/bot/b", "never mind")

    async def finished() -> list[Any]:
        return await events_of(rt, "/bot/b", RunFinished)

    [run] = await until(finished, 20, "the cancel finishes the run")
    assert (run.status, run.error) == ("cancelled", "never mind")
    assert len(server.requests) == 1


async def test_an_error_event_mid_stream_is_waited_out_too(cluster):
    broken = sse(
        message_start(),
        *text_block(0, "Partial"),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    server = Server(ok(broken), answer("Whole answer."))
    rt = await cluster.runtime(app(server))

    assert await rt.ask("/bot/b", "Hello?", timeout=30) == "Whole answer."

    [wait] = await events_of(rt, "/bot/b", ModelRetryWait)
    assert "error event in the response stream overloaded_error" in wait.error
    assert wait.retry_after_s is None
    assert wait.due_ms - wait.since_ms == 1000  # the first backoff step
    steps = await events_of(rt, "/bot/b", AssistantStep)
    assert [s.content for s in steps] == [[{"type": "text", "text": "Whole answer."}]]


async def test_past_model_retry_total_the_run_fails_and_the_entity_goes_on(cluster):
    server = Server(overloaded("2"), answer("Second answer."))
    rt = await cluster.runtime(app(server, model_retry_total_s=1))

    with pytest.raises(RunFailedError, match="HTTP 529 overloaded_error") as failed:
        await rt.ask("/bot/b", "First?", timeout=30)
    assert "gave up after 1 attempts" in str(failed.value.error)
    assert "model_retry_total_s is 1" in str(failed.value.error)
    assert (await rt.status("/bot/b")).status == "idle"  # not parked

    assert await rt.ask("/bot/b", "Second?", timeout=30) == "Second answer."
    runs = await events_of(rt, "/bot/b", RunFinished)
    assert [r.status for r in runs] == ["failed", "completed"]
    assert await events_of(rt, "/bot/b", ModelRetryWait) == []


def test_waits_double_without_retry_after_within_the_total():
    error = ModelError("overloaded", retryable=True)
    first = next_wait("r", error, None, 10, now_ms=1_000)
    assert first is not None and (first.attempt, first.due_ms, first.since_ms) == (1, 2_000, 1_000)
    second = next_wait("r", error, first, 10, now_ms=2_000)
    assert second is not None and (second.attempt, second.due_ms) == (2, 4_000)
    third = next_wait("r", error, second, 10, now_ms=4_000)
    assert third is not None and third.due_ms == 8_000
    # The fourth would end 16 s after the first failure: past the total of 10 s.
    assert next_wait("r", error, third, 10, now_ms=8_000) is None
    told = ModelError("overloaded", retryable=True, retry_after=3.5)
    assert next_wait("r", told, None, 10, now_ms=0).due_ms == 3_500  # type: ignore[union-attr]


async def test_a_missing_api_key_fails_each_run_at_once(cluster, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="", model="claude-sonnet-4-6", tools=[])
        await ctx.agent.run()

    rt = await cluster.runtime(reg)
    for question in ("one?", "two?"):
        with pytest.raises(RunFailedError, match="ANTHROPIC_API_KEY is not set"):
            await rt.ask("/bot/b", question)
    assert (await rt.status("/bot/b")).status == "idle"
    assert await events_of(rt, "/bot/b", HandlerFailed) == []
    assert await events_of(rt, "/bot/b", ModelRetryWait) == []


def test_retry_after_headers_are_read():
    from wakeful.models import _retry_after

    class Failed(Exception):
        def __init__(self, **headers: str) -> None:
            self.response = httpx2.Response(529, headers=headers)

    assert _retry_after(Failed(**{"retry-after": "2"})) == 2.0
    assert _retry_after(Failed(**{"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert _retry_after(Failed(**{"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"})) is None
    assert _retry_after(Failed()) is None
    assert SSE_HEADERS  # the fakes' stream headers carry no retry-after


@pytest.mark.parametrize(
    ("point", "hit"),
    [("wake:after-commit", 1), ("timer:before-fire", 1), ("timer:after-fire", 1)],
    ids=["wait-committed", "before-the-timer-fires", "after-it-fired"],
)
async def test_a_worker_killed_during_the_wait_loses_nothing(cluster, point, hit):
    server = Server(overloaded("1"), answer("Here you are."))
    second = await crash_and_recover(cluster, app(server), "/bot/b", "Hello?", point, hit)

    [finished] = await events_of(second, "/bot/b", RunFinished)
    assert (finished.status, finished.response) == ("completed", "Here you are.")
    assert len(server.requests) == 2  # the step was asked again once, after the wait
    assert len(await events_of(second, "/bot/b", ModelRetryWait)) == 1
    assert await events_of(second, "/bot/b", HandlerFailed) == []
