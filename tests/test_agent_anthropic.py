"""The agent loop end to end on the real anthropic SDK: ``AnthropicModel`` with a
client whose HTTP transport is a fake Messages API (``tests.anthropic_fakes``), so
requests, streams, SDK retries and errors are the real ones, without network or key."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.anthropic_fakes import (
    MODEL,
    Server,
    error_response,
    ok,
    stream_body,
    text_block,
    tool_block,
)
from wakeful import (
    AgentTool,
    AssistantStep,
    HandlerContext,
    LogRecord,
    Registry,
    RunFinished,
    ToolOutcome,
    ToolResult,
)
from wakeful.events import HandlerFailed, ModelRetryWait
from wakeful.models import AnthropicModel

pytestmark = pytest.mark.anyio

SYSTEM = "You add numbers with the add tool."
EPHEMERAL = {"type": "ephemeral"}
CALL_ID = "toolu_01A09q90qw90lq917835lq9"


class Add(msgspec.Struct):
    a: int
    b: int


def adding_app(server: Server, executions: list[str], *, max_retries: int = 0) -> Registry:
    """A bot with one tool, on a Claude model served by ``server``."""
    client = server.client(max_retries=max_retries)  # one client for every wake and attempt
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        async def add(call_id: str, p: Add, signal: Any, on_update: Any) -> ToolResult:
            executions.append(call_id)
            return ToolResult(str(p.a + p.b))

        tool = AgentTool("add", "Adds two integers.", Add, add)
        ctx.use_agent(
            system_prompt=SYSTEM,
            model=AnthropicModel(MODEL, client=client),
            tools=[tool],
        )
        await ctx.agent.run()

    return reg


def tool_use_stream() -> bytes:
    return stream_body(
        text_block(0, "Let me ", "add them."),
        tool_block(1, CALL_ID, "add", '{"a": 2', ', "b": 3}'),
        stop_reason="tool_use",
        output_tokens=40,
        input_tokens=400,
        cache_creation=1200,
    )


def text_stream() -> bytes:
    return stream_body(
        text_block(0, "2 + 3 ", "is 5."),
        stop_reason="end_turn",
        output_tokens=9,
        input_tokens=30,
        cache_read=1200,
    )


TOTAL_USAGE = {
    "input_tokens": 430,
    "output_tokens": 49,
    "cache_creation_input_tokens": 1200,
    "cache_read_input_tokens": 1200,
}


async def events_of(rt: Any, url: str, kind: type) -> list[Any]:
    return [
        r.event
        async for r in rt.events(url)
        if isinstance(r, LogRecord) and isinstance(r.event, kind)
    ]


def cache_breakpoints(body: Any) -> int:
    if isinstance(body, dict):
        return ("cache_control" in body) + sum(cache_breakpoints(v) for v in body.values())
    if isinstance(body, list):
        return sum(cache_breakpoints(v) for v in body)
    return 0


async def test_a_run_with_a_tool_call_on_the_real_sdk(cluster):
    server = Server(ok(tool_use_stream()), ok(text_stream()))
    executions: list[str] = []
    rt = await cluster.runtime(adding_app(server, executions))

    assert await rt.ask("/bot/b", "What is 2 + 3?") == "2 + 3 is 5."

    assert executions == [CALL_ID]
    assert len(server.requests) == 2
    assert all(r.url.path == "/v1/messages" for r in server.requests)
    first, second = server.body(0), server.body(1)
    for body in (first, second):
        assert body["model"] == MODEL and body["stream"] is True
        # Breakpoints on the system prompt, the last tool and the last message block.
        assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
        assert [t["name"] for t in body["tools"]] == ["add"]
        assert body["tools"][-1]["cache_control"] == EPHEMERAL
        assert body["tools"][-1]["input_schema"]["required"] == ["a", "b"]
        assert body["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
        assert cache_breakpoints(body) == 3  # none left behind on earlier messages
    assert first["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is 2 + 3?", "cache_control": EPHEMERAL}],
        }
    ]
    # The second request carries the model's call and the tool's output for its id.
    assert second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me add them."},
                {"type": "tool_use", "id": CALL_ID, "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": CALL_ID,
                    "content": [{"type": "text", "text": "5"}],
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ]
    steps = await events_of(rt, "/bot/b", AssistantStep)
    assert [(s.step, s.stop_reason, s.model) for s in steps] == [
        (1, "tool_use", MODEL),
        (2, "end_turn", MODEL),
    ]
    assert steps[0].usage == {
        "input_tokens": 400,
        "output_tokens": 40,
        "cache_creation_input_tokens": 1200,
        "cache_read_input_tokens": 0,
    }
    outcomes = await events_of(rt, "/bot/b", ToolOutcome)
    assert [(o.tool_call_id, o.content, o.is_error) for o in outcomes] == [
        (CALL_ID, [{"type": "text", "text": "5"}], False)
    ]
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.response) == ("completed", "2 + 3 is 5.")
    assert (finished.steps, finished.tool_calls) == (2, 1)
    assert finished.usage == TOTAL_USAGE


async def test_a_429_is_retried_by_the_sdk_within_the_step(cluster):
    server = Server(
        error_response(429, "rate_limit_error", "Slow down", **{"retry-after-ms": "1"}),
        ok(tool_use_stream()),
        ok(text_stream()),
    )
    executions: list[str] = []
    rt = await cluster.runtime(adding_app(server, executions, max_retries=2))

    assert await rt.ask("/bot/b", "What is 2 + 3?") == "2 + 3 is 5."

    assert len(server.requests) == 3
    assert server.body(0) == server.body(1)  # the SDK sent the same request again
    steps = await events_of(rt, "/bot/b", AssistantStep)
    assert [s.step for s in steps] == [1, 2]  # one journaled step for the retried call
    assert executions == [CALL_ID]
    assert await events_of(rt, "/bot/b", HandlerFailed) == []  # the wake never failed
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.usage) == ("completed", TOTAL_USAGE)


@pytest.mark.parametrize("failing_call", [0, 1], ids=["first-call", "after-a-tool-call"])
async def test_a_500_waits_on_a_timer_and_the_run_resumes_from_the_journal(cluster, failing_call):
    responses = [ok(tool_use_stream()), ok(text_stream())]
    responses.insert(failing_call, error_response(500, "api_error", "Internal server error"))
    server = Server(*responses)
    executions: list[str] = []
    rt = await cluster.runtime(
        adding_app(server, executions, max_retries=0), max_attempts=3, retry_base_ms=10
    )

    assert await rt.ask("/bot/b", "What is 2 + 3?") == "2 + 3 is 5."

    assert len(server.requests) == 3
    # The failed request is sent again as it was: journaled steps are not asked again.
    assert server.body(failing_call) == server.body(failing_call + 1)
    # The run waited on a durable timer (test_model_retry.py), not a failed wake.
    [wait] = await events_of(rt, "/bot/b", ModelRetryWait)
    assert wait.attempt == 1 and "HTTP 500" in wait.error
    assert await events_of(rt, "/bot/b", HandlerFailed) == []
    steps = await events_of(rt, "/bot/b", AssistantStep)
    assert [s.step for s in steps] == [1, 2]  # no step journaled twice
    assert executions == [CALL_ID]  # the settled call did not run again
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.steps, finished.usage) == ("completed", 2, TOTAL_USAGE)
    assert (await rt.status("/bot/b")).status == "idle"


async def test_a_400_fails_the_run(cluster):
    server = Server(
        error_response(400, "invalid_request_error", "messages.0.content: Field required")
    )
    executions: list[str] = []
    rt = await cluster.runtime(adding_app(server, executions, max_retries=2))

    await rt.send("/bot/b", "What is 2 + 3?")
    status = await rt.wait_idle("/bot/b")

    assert status.status == "idle"  # the run failed; the entity did not
    assert len(server.requests) == 1  # neither the SDK nor the worker retried
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert finished.status == "failed"
    assert "HTTP 400 invalid_request_error" in finished.error
    assert "messages.0.content: Field required" in finished.error
    assert await events_of(rt, "/bot/b", AssistantStep) == []
    assert await events_of(rt, "/bot/b", HandlerFailed) == []
    assert executions == []
