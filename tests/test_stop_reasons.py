"""Every stop reason of the Messages API, through the real anthropic SDK (a mocked HTTP
transport): what ends a run as completed, what is continued (``pause_turn``), and what
gets its own status (``truncated``, ``refused``) seen by ``ask``, parents and the CLI."""

from __future__ import annotations

from typing import Any

import pytest

from tests.agent_apps import events_of
from tests.anthropic_fakes import Server, bot_app, ok, stream_body, text_block
from wakeful import (
    AssistantStep,
    HandlerContext,
    Registry,
    RunFailedError,
    RunFinished,
    RunRefusedError,
    RunTruncatedError,
    ScriptedModel,
    Wake,
)
from wakeful.cli_parser import OK, REFUSED, RUN_FAILED, TRUNCATED
from wakeful.cli_reply import exit_code
from wakeful.events import ChildRunFinished

pytestmark = pytest.mark.anyio

REFUSAL = {"type": "refusal", "category": "cyber", "explanation": "It asks for malware."}


def answer(*deltas: str, stop_reason: str, **end: Any) -> bytes:
    blocks = [text_block(0, *deltas)] if deltas else []
    return stream_body(*blocks, stop_reason=stop_reason, **end)


@pytest.mark.parametrize(
    ("stop_reason", "error_type", "status", "error_part"),
    [
        ("max_tokens", RunTruncatedError, "truncated", "output limit of 4096 tokens"),
        ("model_context_window_exceeded", RunTruncatedError, "truncated", "context window"),
        ("refusal", RunRefusedError, "refused", "category cyber): It asks for malware."),
    ],
)
async def test_a_cut_off_or_refused_answer_is_not_a_normal_answer(
    cluster, stop_reason, error_type, status, error_part
):
    end = {"stop_details": REFUSAL} if stop_reason == "refusal" else {}
    server = Server(ok(answer("The first half", " of it", stop_reason=stop_reason, **end)))
    results: list[Any] = []
    rt = await cluster.runtime(bot_app(server, results))

    with pytest.raises(error_type) as raised:
        await rt.ask("/bot/b", "Tell me everything.")

    assert raised.value.status == status
    assert raised.value.stop_reason == stop_reason
    assert raised.value.response == "The first half of it"  # what it did answer
    assert error_part in raised.value.error
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.stop_reason) == (status, stop_reason)
    assert finished.response == "The first half of it"
    if stop_reason == "refusal":
        assert finished.stop_details == REFUSAL
    [result] = results
    assert (result.status, result.stop_reason, result.error) == (
        status,
        stop_reason,
        finished.error,
    )
    assert (await rt.status("/bot/b")).status == "idle"  # the entity goes on


async def test_an_empty_refusal_is_refused_not_an_empty_answer(cluster):
    server = Server(ok(answer(stop_reason="refusal", stop_details={"type": "refusal"})))
    rt = await cluster.runtime(bot_app(server))

    with pytest.raises(RunRefusedError, match="the model refused to answer"):
        await rt.ask("/bot/b", "Something it will not do.")

    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert finished.status == "refused" and finished.response == ""


async def test_a_stop_sequence_completes_the_run_and_is_recorded(cluster):
    server = Server(ok(answer("Step one.", stop_reason="stop_sequence", stop_sequence="###")))
    results: list[Any] = []
    rt = await cluster.runtime(bot_app(server, results))

    assert await rt.ask("/bot/b", "Go.") == "Step one."

    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.stop_reason, finished.stop_sequence) == (
        "completed",
        "stop_sequence",
        "###",
    )
    [step] = await events_of(rt, "/bot/b", AssistantStep)
    assert step.stop_sequence == "###"
    assert results[0].stop_sequence == "###"


async def test_end_turn_records_its_stop_reason(cluster):
    server = Server(ok(answer("Done.", stop_reason="end_turn")))
    rt = await cluster.runtime(bot_app(server))

    assert await rt.ask("/bot/b", "Go.") == "Done."

    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.stop_reason, finished.stop_sequence) == (
        "completed",
        "end_turn",
        None,
    )


SEARCH_USE = {
    "type": "server_tool_use",
    "id": "srvtoolu_01",
    "name": "web_search",
    "input": {"query": "weather in Paris"},
}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01",
    "content": [
        {
            "type": "web_search_result",
            "url": "https://example.com/paris",
            "title": "Paris weather",
            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
            "page_age": "1 day ago",
        }
    ],
}


def whole_block(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        {"type": "content_block_stop", "index": index},
    ]


async def test_pause_turn_is_continued_with_the_paused_content_sent_back(cluster):
    paused = stream_body(
        text_block(0, "Let me search."),
        whole_block(1, SEARCH_USE),
        whole_block(2, SEARCH_RESULT),
        stop_reason="pause_turn",
        server_tool_use={"web_search_requests": 1},
    )
    server = Server(ok(paused), ok(answer(" It is sunny.", stop_reason="end_turn")))
    rt = await cluster.runtime(bot_app(server))

    assert await rt.ask("/bot/b", "Weather in Paris?") == "Let me search. It is sunny."

    assert len(server.requests) == 2
    sent = server.body(1)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant"]
    continued = sent[-1]["content"]
    assert [b["type"] for b in continued] == ["text", "server_tool_use", "web_search_tool_result"]
    assert {k: v for k, v in continued[1].items() if k != "cache_control"} == SEARCH_USE
    result = {k: v for k, v in continued[2].items() if k != "cache_control"}
    assert result == SEARCH_RESULT
    steps = await events_of(rt, "/bot/b", AssistantStep)
    assert [s.stop_reason for s in steps] == ["pause_turn", "end_turn"]
    assert steps[0].server_tool_use == {"web_search_requests": 1}
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert (finished.status, finished.steps, finished.stop_reason) == ("completed", 2, "end_turn")


async def test_a_parent_sees_a_truncated_child_run(cluster):
    reg = Registry()
    cut = ScriptedModel(ScriptedModel.text("Half an ans", stop_reason="max_tokens"))

    @reg.entity("child")
    async def child(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="", model=cut, tools=[])
        await ctx.agent.run()

    @reg.entity("parent")
    async def parent(ctx: HandlerContext) -> None:
        for message in ctx.wake.messages:
            await ctx.spawn("child", "c", initial_message=message.payload, wake=Wake.run_finished())

    rt = await cluster.runtime(reg)
    await rt.send("/parent/p", "go")
    await rt.wait_all_idle()

    [notice] = await events_of(rt, "/parent/p", ChildRunFinished)
    assert (notice.status, notice.stop_reason, notice.response) == (
        "truncated",
        "max_tokens",
        "Half an ans",
    )


def test_ask_exit_codes_by_status():
    assert exit_code("completed") == OK
    assert exit_code("truncated") == TRUNCATED
    assert exit_code("refused") == REFUSED
    assert exit_code("failed") == exit_code("cancelled") == RUN_FAILED
    assert len({OK, TRUNCATED, REFUSED, RUN_FAILED}) == 4


def test_truncated_and_refused_are_run_failed_errors():
    # Code that catches RunFailedError around ask keeps working.
    assert issubclass(RunTruncatedError, RunFailedError)
    assert issubclass(RunRefusedError, RunFailedError)
