"""What the API returns is kept in the journal and sent back as the API takes it
(``models._block_dict``, the projection): citations, ``tool_use.caller``, stop
details and server-tool usage, through the real anthropic SDK on a mocked transport."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.agent_apps import events_of
from tests.anthropic_fakes import MODEL, Server, ok, stream_body, text_block
from wakeful import (
    AgentTool,
    AssistantStep,
    HandlerContext,
    Registry,
    RunFinished,
    ToolResult,
)
from wakeful.models import AnthropicModel

pytestmark = pytest.mark.anyio

CITATION = {
    "type": "char_location",
    "cited_text": "The grass is green.",
    "document_index": 0,
    "document_title": None,
    "start_char_index": 0,
    "end_char_index": 19,
}
CALLER = {"type": "code_execution_20250825", "tool_id": "srvtoolu_exec"}


class Noop(msgspec.Struct):
    pass


def app(server: Server) -> Registry:
    client = server.client()
    reg = Registry()

    async def noop(call_id: str, p: Noop, signal: Any, on_update: Any) -> ToolResult:
        return ToolResult("done")

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(
            system_prompt="You cite.",
            model=AnthropicModel(MODEL, client=client),
            tools=[AgentTool("noop", "Does nothing.", Noop, noop)],
        )
        await ctx.agent.run()

    return reg


def cited_text(index: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": "", "citations": []},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "citations_delta", "citation": {**CITATION, "file_id": None}},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": "the grass is green"},
        },
        {"type": "content_block_stop", "index": index},
    ]


def called_by(index: int) -> list[dict[str, Any]]:
    block = {"type": "tool_use", "id": "toolu_c1", "name": "noop", "input": {}, "caller": CALLER}
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        {"type": "content_block_stop", "index": index},
    ]


async def test_citations_are_journaled_and_sent_back(cluster):
    server = Server(
        ok(stream_body(text_block(0, "Per the document, "), cited_text(1), stop_reason="end_turn")),
        ok(stream_body(text_block(0, "Yes."), stop_reason="end_turn")),
    )
    rt = await cluster.runtime(app(server))

    assert await rt.ask("/bot/b", "What colour is grass?") == (
        "Per the document, the grass is green"
    )
    [step] = await events_of(rt, "/bot/b", AssistantStep)
    assert step.content[1] == {
        "type": "text",
        "text": "the grass is green",
        "citations": [CITATION],  # the null title kept, the null file_id dropped
    }
    await rt.ask("/bot/b", "Sure?")
    assistant = server.body(1)["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][1]["citations"] == [CITATION]


async def test_tool_use_caller_server_tool_usage_and_stop_details_are_kept(cluster):
    server = Server(
        ok(
            stream_body(
                called_by(0), stop_reason="tool_use", server_tool_use={"web_search_requests": 2}
            )
        ),
        ok(
            stream_body(
                text_block(0, "Sorry"),
                stop_reason="refusal",
                stop_details={"type": "refusal", "category": "bio", "explanation": "No."},
            )
        ),
    )
    rt = await cluster.runtime(app(server))
    await rt.send("/bot/b", "Go.")
    await rt.wait_idle("/bot/b")

    first, second = await events_of(rt, "/bot/b", AssistantStep)
    assert first.content[0]["caller"] == CALLER
    assert first.server_tool_use == {"web_search_requests": 2}
    sent = server.body(1)["messages"][1]["content"][0]
    assert sent["caller"] == CALLER and sent["id"] == "toolu_c1"  # sent back as returned
    assert second.stop_details == {"type": "refusal", "category": "bio", "explanation": "No."}
    [finished] = await events_of(rt, "/bot/b", RunFinished)
    assert finished.stop_details == second.stop_details
    assert (finished.status, finished.stop_reason) == ("refused", "refusal")
