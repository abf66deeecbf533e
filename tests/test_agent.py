"""The agent loop: runs, tools, journal and resume, cancellation, limits, live output."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from tests.apps.harness import until
from tests.faults import crash_and_recover
from wakeful import (
    AgentTool,
    AssistantStep,
    Collection,
    HandlerContext,
    LiveRecord,
    LogRecord,
    Message,
    ModelError,
    Registry,
    RunFinished,
    ScriptedModel,
    ToolOutcome,
    ToolResult,
    UserTurn,
)
from wakeful.errors import RunFailedError
from wakeful.events import HandlerFailed
from wakeful.history import INTERRUPTED
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio


class Add(msgspec.Struct):
    a: int
    b: int


class Row(msgspec.Struct):
    key: str
    value: str


def sums(state: dict[str, list[dict[str, str]]]) -> list[tuple[str, str]]:
    return sorted((row["key"], row["value"]) for row in state["sums"])


def call(call_id: str, a: int, b: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "add", "input": {"a": a, "b": b}}


def adding_model() -> ScriptedModel:
    """Two parallel calls, then one more, then the answer; ids fixed per step, so a
    repeated model call (after a crash before its step was journaled) answers the same."""

    def respond(request: ModelRequest) -> ModelResponse:
        steps = sum(1 for m in request.messages if m["role"] == "assistant")
        if steps == 0:
            content = [{"type": "text", "text": "Adding."}, call("c1", 2, 3), call("c2", 4, 5)]
            return ModelResponse(content=content, stop_reason="tool_use")
        if steps == 1:
            return ModelResponse(content=[call("c3", 10, 1)], stop_reason="tool_use")
        return ModelResponse(
            content=[{"type": "text", "text": "5, 9 and 11."}], stop_reason="end_turn"
        )

    return ScriptedModel(respond)


def adding_app(
    model: Any,
    executions: list[str],
    *,
    rerun: bool = True,
    results: list[Any] | None = None,
    **options: Any,
) -> Registry:
    reg = Registry()

    @reg.entity("bot", state={"sums": Collection(row=Row)})
    async def bot(ctx: HandlerContext) -> None:
        async def add(
            call_id: str, p: Add, signal: Any, on_update: Callable[[Any], None]
        ) -> ToolResult:
            executions.append(call_id)
            on_update({"adding": [p.a, p.b]})
            ctx.db.actions.sums_insert(row=Row(call_id, str(p.a + p.b)))
            return ToolResult(str(p.a + p.b), details={"sum": p.a + p.b})

        tool = AgentTool("add", "Adds two integers.", Add, add, rerun_when_in_doubt=rerun)
        ctx.use_agent(system_prompt="You add.", model=model, tools=[tool], **options)
        result = await ctx.agent.run()
        if results is not None:
            results.append(result)

    return reg


async def test_a_run_with_parallel_tool_calls(cluster):
    executions: list[str] = []
    results: list[Any] = []
    model = adding_model()
    rt = await cluster.runtime(adding_app(model, executions, results=results))
    assert await rt.ask("/bot/b", "add things") == "5, 9 and 11."
    assert sorted(executions) == ["c1", "c2", "c3"]
    assert len(model.requests) == 3
    result = results[-1]
    assert (result.status, result.steps, result.tool_calls) == ("completed", 3, 3)
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    finished = [r.event async for r in rt.events("/bot/b") if isinstance(r.event, RunFinished)]
    assert finished[-1].usage == msgspec.structs.asdict(result.usage)
    # Results go back in call order, whatever order the calls finished in.
    second_request = model.requests[1].messages
    assert [b["tool_use_id"] for b in second_request[-1]["content"]] == ["c1", "c2"]
    assert sums(await rt.state("/bot/b")) == [("c1", "5"), ("c2", "9"), ("c3", "11")]
    details = [e.details for e in await rt.history("/bot/b") if isinstance(e, ToolOutcome)]
    assert {d["sum"] for d in details} == {5, 9, 11}


async def test_bad_arguments_and_unknown_tools_become_error_results(cluster):
    executions: list[str] = []
    model = ScriptedModel(
        [
            ModelResponse(
                content=[
                    {"type": "tool_use", "id": "x1", "name": "add", "input": {"a": "two", "b": 1}},
                    {"type": "tool_use", "id": "x2", "name": "subtract", "input": {}},
                ],
                stop_reason="tool_use",
            ),
            "Sorry.",
        ]
    )
    rt = await cluster.runtime(adding_app(model, executions))
    assert await rt.ask("/bot/b", "go") == "Sorry."
    assert executions == []
    results = {b["tool_use_id"]: b for b in model.requests[1].messages[-1]["content"]}
    assert (
        results["x1"]["is_error"]
        and "Expected `int`, got `str` - at `$.a`" in results["x1"]["content"][0]["text"]
    )
    assert (
        results["x2"]["is_error"]
        and "Unknown tool 'subtract'. Available tools: add" in results["x2"]["content"][0]["text"]
    )


async def test_the_conversation_carries_over_between_runs(cluster):
    model = ScriptedModel(["First answer.", "Second answer."])
    rt = await cluster.runtime(adding_app(model, []))
    assert await rt.ask("/bot/b", "one") == "First answer."
    assert await rt.ask("/bot/b", "two") == "Second answer."
    assert model.requests[1].messages == [
        {"role": "user", "content": [{"type": "text", "text": "one"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "First answer."}]},
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
    ]
    assert await rt.conversation("/bot/b") == [
        *model.requests[1].messages,
        {"role": "assistant", "content": [{"type": "text", "text": "Second answer."}]},
    ]


async def test_step_limit_fails_the_run(cluster):
    results: list[Any] = []

    def always_tools(request: ModelRequest) -> ModelResponse:
        n = len(request.messages)
        return ModelResponse(content=[call(f"k{n}", 1, 1)], stop_reason="tool_use")

    rt = await cluster.runtime(
        adding_app(ScriptedModel(always_tools), [], results=results, max_steps=2)
    )
    await rt.send("/bot/b", "loop forever")
    await rt.wait_idle("/bot/b")
    assert results[-1].status == "failed"
    assert results[-1].error == "the run reached its limit of 2 model steps"
    finished = [r.event async for r in rt.events("/bot/b") if isinstance(r.event, RunFinished)]
    assert [(f.status, f.steps) for f in finished] == [("failed", 2)]


async def test_a_non_retryable_model_error_fails_the_run_with_its_message(cluster):
    def broken(request: ModelRequest) -> ModelResponse:
        raise ModelError("model 'x' call failed: HTTP 400 invalid_request_error", retryable=False)

    results: list[Any] = []
    rt = await cluster.runtime(adding_app(ScriptedModel(broken), [], results=results))
    await rt.send("/bot/b", "hi")
    status = await rt.wait_idle("/bot/b")
    assert status.status == "idle"
    assert results[-1].status == "failed" and "HTTP 400" in results[-1].error


async def test_missing_api_key_fails_the_run_at_once_with_a_clear_error(cluster, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    rt = await cluster.runtime(adding_app("claude-sonnet-4-6", []))
    with pytest.raises(RunFailedError, match="ANTHROPIC_API_KEY is not set") as failed:
        await rt.ask("/bot/b", "hi")
    assert failed.value.status == "failed"
    status = await rt.wait_idle("/bot/b")
    assert status.status == "idle"  # the run failed; the entity goes on (not parked)
    assert [r async for r in rt.events("/bot/b") if isinstance(r.event, AssistantStep)] == []
    failures = [r async for r in rt.events("/bot/b") if isinstance(r.event, HandlerFailed)]
    assert failures == []  # no retries


# --- crash and resume -----------------------------------------------------------------


async def run_with_crash(cluster, reg: Registry, url: str, point: str, hit: int) -> Any:
    return await crash_and_recover(cluster, reg, url, "add things", point, hit, timeout=20)


# The crash-free run commits: the user turn with step 1 and its intents, 2 results, step 2
# with its intent, its result: 5 flushes; step 3 and the run's end go with the wake's commit.
FLUSHES = 5


async def crash_at_every_flush(
    cluster: Any, point: str, check: Callable[[int, ScriptedModel, list[str]], None]
) -> None:
    """Run the adding app once without a fault, then once per flush of the run with a
    crash at ``point`` of that flush; every run must end with the same conversation,
    state and response. ``check(hit, model, executions)`` adds the point's own checks."""
    reference = await cluster.runtime(adding_app(adding_model(), []))
    assert await reference.ask("/bot/ref", "add things") == "5, 9 and 11."
    expected = await reference.conversation("/bot/ref")
    expected_state = await reference.state("/bot/ref")
    await reference.close()
    cluster.runtimes.remove(reference)

    # The flushes of the run, then the wake's own commit (step 3 and the run's end).
    wake_point = point.replace("flush:", "wake:")
    crashes = [(point, hit) for hit in range(1, FLUSHES + 1)] + [(wake_point, 1)]
    for point, hit in crashes:
        executions: list[str] = []
        model = adding_model()
        url = f"/bot/{point.replace(':', '-')}-{hit}"
        rt = await run_with_crash(cluster, adding_app(model, executions), url, point, hit)
        assert await rt.conversation(url) == expected, f"crash at {point} {hit}"
        check(hit, model, executions)
        assert sorted(set(executions)) == ["c1", "c2", "c3"], f"crash at {point} {hit}"
        assert sums(await rt.state(url)) == sums(expected_state), f"crash at {point} {hit}"
        finished = [r.event async for r in rt.events(url) if isinstance(r.event, RunFinished)]
        assert [(f.status, f.response) for f in finished] == [("completed", "5, 9 and 11.")]
        await rt.close()
        cluster.runtimes.remove(rt)


async def test_crash_after_every_journaled_step_resumes_to_the_same_run(cluster):
    def check(hit: int, model: ScriptedModel, executions: list[str]) -> None:
        assert len(model.requests) == 3, f"crash after flush {hit}: a journaled step was re-sent"
        # No call ran twice: every crash point is after a commit, so no call was in doubt
        # except while the parallel calls of step 1 were between their intent and result.
        assert len(executions) <= 4, f"crash after flush {hit}: {executions}"

    await crash_at_every_flush(cluster, "flush:after-commit", check)


async def test_crash_before_every_commit_resumes_to_the_same_run(cluster):
    """Die just before each commit of the run (the commit never lands): the run resumes
    to the same conversation, state and response as a run without the crash."""

    def check(hit: int, model: ScriptedModel, executions: list[str]) -> None:
        # At most the one step whose commit was lost is asked again.
        assert len(model.requests) in (3, 4), f"crash before flush {hit}: {len(model.requests)}"

    await crash_at_every_flush(cluster, "flush:before-commit", check)


async def test_crash_before_a_step_is_journaled_calls_the_model_again_for_that_step(cluster):
    model = adding_model()
    # Flush 1 commits step 1 (with the user turn), 2 and 3 its results, 4 step 2: die
    # just before it.
    rt = await run_with_crash(cluster, adding_app(model, []), "/bot/b", "flush:before-commit", 4)
    assert len(model.requests) == 4  # step 2 was asked twice, steps 1 and 3 once
    assert (await rt.conversation("/bot/b"))[-1]["content"][0]["text"] == "5, 9 and 11."


async def test_a_crash_before_a_runs_first_commit_takes_its_input_again(cluster):
    """The user turn is committed with the first step: a crash before that commit leaves
    the input unhandled, so the next worker takes it again (one user turn in the log) and
    asks the model again for step 1; nothing ran."""
    model = adding_model()
    executions: list[str] = []
    url = "/bot/first"
    rt = await run_with_crash(cluster, adding_app(model, executions), url, "flush:before-commit", 1)
    assert len(model.requests) == 4  # step 1 was asked twice, steps 2 and 3 once
    assert model.requests[0].messages == model.requests[1].messages  # the same step 1
    assert sorted(executions) == ["c1", "c2", "c3"]  # no call ran before its intent
    turns = [r.event async for r in rt.events(url) if isinstance(r.event, UserTurn)]
    message = [r.id async for r in rt.events(url) if isinstance(r.event, Message)]
    assert [t.sources for t in turns] == [message]
    assert (await rt.conversation(url))[-1]["content"][0]["text"] == "5, 9 and 11."


async def test_an_in_doubt_call_is_rerun_with_the_same_id(cluster):
    executions: list[str] = []
    # Flush 2 commits the first tool result: die before it, after the tool ran.
    rt = await run_with_crash(
        cluster, adding_app(adding_model(), executions), "/bot/b", "flush:before-commit", 2
    )
    assert sorted(set(executions)) == ["c1", "c2", "c3"]
    assert len(executions) in (4, 5)  # one or both parallel calls were in doubt, and ran again
    outcomes = [e for e in await rt.history("/bot/b") if isinstance(e, ToolOutcome)]
    assert sorted(o.tool_call_id for o in outcomes) == ["c1", "c2", "c3"]
    assert not any(o.is_error for o in outcomes)


async def test_an_in_doubt_call_of_a_tool_that_must_not_rerun_is_reported_interrupted(cluster):
    executions: list[str] = []
    rt = await run_with_crash(
        cluster,
        adding_app(adding_model(), executions, rerun=False),
        "/bot/b",
        "flush:before-commit",
        2,
    )
    assert len(executions) == len(set(executions))  # nothing ran twice
    outcomes = {e.tool_call_id: e for e in await rt.history("/bot/b") if isinstance(e, ToolOutcome)}
    interrupted = [o for o in outcomes.values() if o.is_error]
    assert interrupted, "the in-doubt call must get an error result"
    assert all("was interrupted" in o.content[0]["text"] for o in interrupted)
    assert INTERRUPTED not in str(await rt.conversation("/bot/b"))  # every call has a real result


# --- cancellation ---------------------------------------------------------------------


def test_the_signal_calls_back_once_when_it_fires_and_at_once_after():
    """The loop races the model call and the tools against the signal with a callback
    (``CancelSignal.on_cancel``), so no task waits on the signal."""
    from wakeful.cancellation import CancelSignal

    signal = CancelSignal()
    fired: list[str] = []
    signal.on_cancel(lambda: fired.append("kept"))
    remove = signal.on_cancel(lambda: fired.append("removed"))
    remove()
    signal.cancel("stop")
    signal.cancel("again")
    assert fired == ["kept"]
    signal.on_cancel(lambda: fired.append("late"))  # already fired: called at once
    assert fired == ["kept", "late"]


class HangingModel:
    """Streams some text, then waits until cancelled."""

    name = "hanging"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False
        self.calls = 0

    async def complete(self, request: ModelRequest, *, on_text: Any = None) -> ModelResponse:
        self.calls += 1
        if self.calls > 1:
            return ModelResponse(
                content=[{"type": "text", "text": "Back again."}], stop_reason="end_turn"
            )
        if on_text:
            on_text("Thinking about ")
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


async def test_cancel_mid_stream_aborts_the_model_and_finishes_the_run_cancelled(cluster):
    model = HangingModel()
    results: list[Any] = []
    rt = await cluster.runtime(adding_app(model, [], results=results))
    await rt.send("/bot/b", "think")
    await asyncio.wait_for(model.started.wait(), 10)
    await rt.cancel("/bot/b")
    await rt.wait_idle("/bot/b")
    assert model.cancelled
    assert results[0].status == "cancelled"  # (the wake for the cancel input itself is a no-op)
    finished = [r.event async for r in rt.events("/bot/b") if isinstance(r.event, RunFinished)]
    assert [f.status for f in finished] == ["cancelled"]
    # The entity takes new messages and runs again.
    assert await rt.ask("/bot/b", "again") == "Back again."


async def test_cancel_mid_tool_signals_the_running_tool(cluster):
    seen: list[str | None] = []
    started = asyncio.Event()
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        async def wait(call_id: str, p: Any, signal: Any, on_update: Any) -> str:
            started.set()
            await signal.wait()
            seen.append(signal.kind)
            return "stopped"

        tool = AgentTool("wait", "Waits.", {"type": "object", "properties": {}}, wait)
        model = ScriptedModel(
            [
                ModelResponse(
                    content=[{"type": "tool_use", "id": "w1", "name": "wait", "input": {}}],
                    stop_reason="tool_use",
                )
            ]
        )
        ctx.use_agent(system_prompt="", model=model, tools=[tool])
        await ctx.agent.run()

    rt = await cluster.runtime(reg)
    await rt.send("/bot/b", "wait")
    await asyncio.wait_for(started.wait(), 10)
    await rt.cancel("/bot/b", reason="user pressed stop")
    await rt.wait_idle("/bot/b")
    assert seen == ["cancel"]
    finished = [r.event async for r in rt.events("/bot/b") if isinstance(r.event, RunFinished)]
    assert [(f.status, f.error) for f in finished] == [("cancelled", "user pressed stop")]
    # The interrupted call still has a result in the conversation, so it stays valid.
    convo = await rt.conversation("/bot/b")
    assert convo[-1]["content"][0]["tool_use_id"] == "w1"


# --- live output ------------------------------------------------------------------------


async def test_live_output_streams_deltas_and_tool_progress_and_resumes(cluster):
    model = adding_model()
    rt = await cluster.runtime(adding_app(model, []))
    live: list[LiveRecord] = []
    durable: list[LogRecord] = []

    async def follow() -> None:
        async for record in rt.events("/bot/b", live=True, block_ms=200):
            (live if isinstance(record, LiveRecord) else durable).append(record)
            if isinstance(record, LogRecord) and isinstance(record.event, RunFinished):
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await rt.send("/bot/b", "add things")
    await asyncio.wait_for(follower, 10)
    text = "".join(r.event.data for r in live if r.event.kind == "text")
    assert "Adding." in text and "5, 9 and 11." in text
    updates = [r.event for r in live if r.event.kind == "tool_update"]
    assert {u.tool_call_id for u in updates} == {"c1", "c2", "c3"}
    assert {u.tool for u in updates} == {"add"}
    # Only whole messages are durable: no delta is in the log.
    assert not any("delta" in type(r.event).__name__.lower() for r in durable)
    # A client that reconnects from its last ids gets nothing twice, and then what is new.
    resumed = rt.events(
        "/bot/b", after=durable[-1].id, live=True, live_after=live[-1].id, block_ms=50
    )
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(resumed), 0.3)
    resumed = rt.events(
        "/bot/b", after=durable[-1].id, live=True, live_after=live[-1].id, block_ms=50
    )
    await rt.send("/bot/b", "more")
    record = await asyncio.wait_for(anext(resumed), 10)
    assert record.id not in {r.id for r in live} | {r.id for r in durable}
    await resumed.aclose()


async def test_a_lost_lease_ends_the_wake_even_if_the_handler_catches_exception(
    cluster, caplog: pytest.LogCaptureFixture
):
    """WakeInterrupted is a BaseException: ``except Exception`` around ``ctx.agent.run()``
    cannot swallow it, so the wake stops without committing (nothing is acknowledged)."""
    caplog.set_level(logging.INFO, logger="wakeful")
    swallowed: list[BaseException] = []
    ended = asyncio.Event()

    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        _use_lease_tripping_agent(ctx)
        try:
            await ctx.agent.run()
        except Exception as exc:  # the broad catch a handler may well have
            swallowed.append(exc)
            ctx.reply("swallowed the interruption")
        finally:
            ended.set()

    rt = await cluster.runtime(reg)
    await rt.send("/bot/b", "go")
    await asyncio.wait_for(ended.wait(), 15)

    await _until_interrupted(caplog, "/bot/b")
    assert swallowed == [], "except Exception must not catch the interruption"
    assert not [r async for r in rt.events("/bot/b") if isinstance(r.event, RunFinished)]


async def test_an_interruption_inside_a_handler_s_task_group_ends_only_that_wake(
    cluster, caplog: pytest.LogCaptureFixture
):
    """A handler that runs its agent in its own task group sees the interruption wrapped in
    a BaseExceptionGroup: the wake still ends as interrupted, and the worker goes on
    serving other entities (the group must not escape into the worker's runner group)."""
    caplog.set_level(logging.INFO, logger="wakeful")

    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        _use_lease_tripping_agent(ctx)
        async with asyncio.TaskGroup() as group:
            group.create_task(ctx.agent.run())

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for message in ctx.wake.messages:
            ctx.reply(message.payload)

    rt = await cluster.runtime(reg)
    await rt.send("/bot/b", "go")

    await _until_interrupted(caplog, "/bot/b")
    assert await asyncio.wait_for(rt.ask("/echo/e", "still serving"), 15) == "still serving"
    assert not [r async for r in rt.events("/bot/b") if isinstance(r.event, RunFinished)]


def _use_lease_tripping_agent(ctx: HandlerContext) -> None:
    """An agent whose one tool does what the worker does when it loses the partition's
    lease mid-wake: it sets the wake's signal with kind "lease"."""

    def respond(request: ModelRequest) -> ModelResponse:
        if any(m["role"] == "assistant" for m in request.messages):
            return ModelResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")
        trip = {"type": "tool_use", "id": "t1", "name": "trip", "input": {}}
        return ModelResponse(content=[trip], stop_reason="tool_use")

    async def trip(call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
        signal.cancel("the partition lease was lost", kind="lease")
        return ToolResult("tripped")

    tool = AgentTool("trip", "Trips the lease.", {"type": "object"}, trip)
    ctx.use_agent(system_prompt="You trip.", model=ScriptedModel(respond), tools=[tool])


async def _until_interrupted(caplog: pytest.LogCaptureFixture, url: str) -> None:
    async def interrupted() -> bool:
        return any(
            "interrupted" in r.getMessage() and url in r.getMessage() for r in caplog.records
        )

    await until(interrupted, 15, "the worker to end the wake as interrupted")


# --- commits per step ---------------------------------------------------------------


def count_commits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The url of every ``Store.commit`` from now on, in order."""
    from wakeful.store import Store

    commits: list[str] = []
    original = Store.commit

    async def counting(store: Store, url: str, token: str, **kwargs: Any) -> list[str]:
        commits.append(url)
        return await original(store, url, token, **kwargs)

    monkeypatch.setattr(Store, "commit", counting)
    return commits


async def test_a_step_costs_at_most_two_commits(cluster, monkeypatch):
    """A step is committed with its calls' intents (the first step with the user turn
    too), the last step with the run's end and the wake: a run of two tool steps and an
    answer is five commits (one per step with its intent, one per result, one for the
    answer)."""
    commits = count_commits(monkeypatch)

    def respond(request: ModelRequest) -> ModelResponse:
        steps = sum(1 for m in request.messages if m["role"] == "assistant")
        if steps < 2:
            return ModelResponse(content=[call(f"c{steps}", steps, 1)], stop_reason="tool_use")
        return ModelResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")

    executions: list[str] = []
    rt = await cluster.runtime(adding_app(ScriptedModel(respond), executions))
    assert await rt.ask("/bot/n", "add") == "done"
    assert executions == ["c0", "c1"]
    # user turn + step 1 + intent; result; step 2 + intent; result; step 3 + end + wake
    assert commits.count("/bot/n") == 5


async def test_a_run_that_answers_at_once_is_one_commit(cluster, monkeypatch):
    """The user turn is not a commit point of its own: a run whose first step answers
    is committed once, with the wake (its user turn, step and end), and a crash before
    that commit takes the input again (``crash_at_every_flush`` covers ``wake:*``)."""
    commits = count_commits(monkeypatch)
    rt = await cluster.runtime(adding_app(ScriptedModel(["One.", "Two."]), []))
    assert await rt.ask("/bot/once", "first") == "One."
    assert await rt.ask("/bot/once", "second") == "Two."
    assert commits.count("/bot/once") == 2  # one a run
    kinds = [type(r.event).__name__ async for r in rt.events("/bot/once")]
    assert kinds.count("UserTurn") == 2 and kinds.count("RunFinished") == 2
