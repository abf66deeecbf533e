"""The Messages API request options of an agent (issue 15, item 6), sent through the
real anthropic SDK with a mocked HTTP transport: thinking, tool_choice, stop
sequences, metadata.user_id from the run's trusted identity, service tier, headers and
betas, output config and server tools; each option checked where it is written."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import msgspec
import pytest

from tests.anthropic_fakes import MODEL, Server, ok, stream_body, text_block, tool_block
from wakeful import (
    AgentTool,
    HandlerContext,
    Registry,
    ScriptedModel,
    ToolContractError,
    ToolResult,
    define_agent,
    define_tool,
)
from wakeful.compaction import SUMMARY_SYSTEM
from wakeful.models import AnthropicModel, ModelRequest

pytestmark = pytest.mark.anyio

URL = "/bot/b"
WEB_SEARCH = {"type": "web_search_20250305", "max_uses": 2}
OPTIONS: dict[str, Any] = {
    "max_output_tokens": 8000,
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "stop_sequences": ["\nEND"],
    "user_id_from": "user",
    "service_tier": "standard_only",
    "extra_headers": {"X-Request-Source": "wakeful-test"},
    "betas": ["interleaved-thinking-2025-05-14"],
    "effort": "high",
    "server_tools": [WEB_SEARCH],
}


class Add(msgspec.Struct):
    a: int
    b: int


async def add(call_id: str, p: Add, signal: Any, on_update: Any) -> ToolResult:
    return ToolResult(str(p.a + p.b))


def app(model: Any, **options: Any) -> Registry:
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(
            system_prompt="You add.",
            model=model,
            tools=[AgentTool("add", "Adds.", Add, add)],
            **options,
        )
        await ctx.agent.run()

    return reg


def thinking_block(index: int, thinking: str, signature: str) -> list[dict[str, Any]]:
    start = {"type": "thinking", "thinking": "", "signature": ""}
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": thinking},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature},
        },
        {"type": "content_block_stop", "index": index},
    ]


def web_search_blocks(index: int) -> list[dict[str, Any]]:
    use = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}
    result = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://example.com/sum",
                "title": "Sums",
                "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
                "page_age": None,
            }
        ],
    }
    return [
        {"type": "content_block_start", "index": index, "content_block": use},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": '{"query": "2+3"}'},
        },
        {"type": "content_block_stop", "index": index},
        {"type": "content_block_start", "index": index + 1, "content_block": result},
        {"type": "content_block_stop", "index": index + 1},
    ]


async def test_every_request_option_reaches_the_api_as_the_sdk_sends_it(cluster):
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}
    first = stream_body(
        thinking_block(0, "I should search, then add.", "sig-1"),
        [
            {"type": "content_block_start", "index": 1, "content_block": redacted},
            {"type": "content_block_stop", "index": 1},
        ],
        web_search_blocks(2),
        tool_block(4, "toolu_1", "add", '{"a": 2, "b": 3}'),
        stop_reason="tool_use",
    )
    server = Server(ok(first), ok(stream_body(text_block(0, "5"), stop_reason="end_turn")))
    rt = await cluster.runtime(app(server.model(), **OPTIONS))

    reply = await rt.ask(
        URL,
        "What is 2 + 3?",
        identity={"user": "alice"},
        client_data={"user": "mallory"},  # untrusted: never the user id
    )

    assert reply == "5"
    for n, request in enumerate(server.requests):
        body = server.body(n)
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        assert body["max_tokens"] == 8000
        assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
        assert body["stop_sequences"] == ["\nEND"]
        assert body["metadata"] == {"user_id": "alice"}
        assert body["service_tier"] == "standard_only"
        assert body["output_config"] == {"effort": "high"}
        assert [t["name"] for t in body["tools"]] == ["add", "web_search"]
        assert body["tools"][1] == {
            "name": "web_search",
            **WEB_SEARCH,
            "cache_control": {"type": "ephemeral"},
        }
        assert request.headers["x-request-source"] == "wakeful-test"
        assert request.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    # The thinking blocks (with the signature, the redacted data) and the server tool's
    # blocks go back as given.
    assistant = server.body(1)["messages"][1]
    assert assistant["role"] == "assistant"
    assert [b["type"] for b in assistant["content"]] == [
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "tool_use",
    ]
    assert assistant["content"][0]["signature"] == "sig-1"
    assert assistant["content"][1] == redacted
    assert assistant["content"][3]["content"][0]["encrypted_content"].startswith("Eqgf")


async def test_without_an_identity_no_user_id_is_sent_and_a_static_one_stays(cluster):
    server = Server(
        ok(stream_body(text_block(0, "hi"), stop_reason="end_turn")),
        ok(stream_body(text_block(0, "hi"), stop_reason="end_turn")),
    )
    rt = await cluster.runtime(
        app(server.model(), user_id_from="user", metadata={"user_id": "tenant-7"})
    )

    await rt.ask(URL, "hello", client_data={"user": "mallory"})
    await rt.ask(URL, "again", identity={"org": "acme"})  # no "user" claim

    assert [server.body(n)["metadata"] for n in (0, 1)] == [
        {"user_id": "tenant-7"},
        {"user_id": "tenant-7"},
    ]
    assert "thinking" not in server.body(0) and "tool_choice" not in server.body(0)


async def test_a_long_identity_claim_is_sent_hashed_within_the_apis_limit(cluster):
    server = Server(ok(stream_body(text_block(0, "hi"), stop_reason="end_turn")))
    rt = await cluster.runtime(app(server.model(), user_id_from="user"))

    await rt.ask(URL, "hello", identity={"user": "u" * 300})

    user_id = server.body(0)["metadata"]["user_id"]
    assert user_id.startswith("sha256:") and len(user_id) <= 256


async def test_betas_join_a_beta_header_given_with_the_extra_headers():
    server = Server(ok(stream_body(text_block(0, "hi"), stop_reason="end_turn")))
    request = ModelRequest(
        model=MODEL,
        system="s",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"Anthropic-Beta": "files-api-2025-04-14"},
        betas=["interleaved-thinking-2025-05-14", "files-api-2025-04-14"],
    )
    await server.model().complete(request)
    assert server.requests[0].headers["anthropic-beta"] == (
        "files-api-2025-04-14,interleaved-thinking-2025-05-14"
    )


async def test_count_tokens_sends_the_input_options_and_not_the_output_ones():
    server = Server(httpx2.Response(200, json={"input_tokens": 1234}))
    model = AnthropicModel(MODEL, client=server.client())
    request = ModelRequest(
        model=MODEL,
        system="s",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"name": "web_search", **WEB_SEARCH}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        tool_choice={"type": "auto"},
        stop_sequences=["END"],
        metadata={"user_id": "alice"},
        service_tier="auto",
        betas=["interleaved-thinking-2025-05-14"],
        output_config={"effort": "low"},
    )

    assert await model.count_tokens(request) == 1234

    [sent] = server.requests
    assert sent.url.path == "/v1/messages/count_tokens"
    body = json.loads(sent.content)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["tool_choice"] == {"type": "auto"}
    assert body["output_config"] == {"effort": "low"}
    assert body["tools"][0]["name"] == "web_search"
    for output_only in ("max_tokens", "stop_sequences", "metadata", "service_tier"):
        assert output_only not in body
    assert sent.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


async def test_a_scripted_model_records_the_options(cluster):
    model = ScriptedModel(["ok"])
    rt = await cluster.runtime(
        app(model, tool_choice="any", stop_sequences=["STOP"], user_id_from="user")
    )

    await rt.ask(URL, "hi", identity={"user": "bob"})

    [request] = model.requests
    assert request.tool_choice == {"type": "any"}
    assert request.stop_sequences == ["STOP"]
    assert request.metadata == {"user_id": "bob"}
    assert request.thinking is None and request.extra_headers is None


async def test_an_output_format_is_sent_as_the_output_config(cluster):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    server = Server(ok(stream_body(text_block(0, '{"n": 5}'), stop_reason="end_turn")))
    rt = await cluster.runtime(
        app(server.model(), output_format={"type": "json_schema", "schema": schema})
    )
    assert await rt.ask(URL, "n?") == '{"n": 5}'
    assert server.body(0)["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


async def _add(ctx: Any) -> int:
    return int(ctx.input.a + ctx.input.b)


TOOL = define_tool(id="test.add/v1", description="Adds.", input=Add, execute=_add)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "option 'thinking': Expected"),
        ({"thinking": {"type": "enabled"}}, "option 'thinking': Object missing required field"),
        ({"thinking": {"type": "on"}}, "option 'thinking': Invalid value 'on'"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 4096}},
            r"option 'thinking': budget_tokens \(4096\) must be less than max_output_tokens",
        ),
        (
            {"thinking": {"type": "adaptive"}, "tool_choice": "any"},
            "option 'tool_choice': 'any' forces a tool call",
        ),
        (
            {"tool_choice": {"type": "tool", "name": "mul"}},
            r"option 'tool_choice': no tool named 'mul' \(the agent's tools: add\)",
        ),
        ({"tool_choice": "sometimes"}, "option 'tool_choice'"),
        ({"stop_sequences": ["  "]}, "option 'stop_sequences': stop sequence 0"),
        ({"stop_sequences": "END"}, "option 'stop_sequences': Expected `array"),
        ({"metadata": {"user": "x"}}, "option 'metadata': Object contains unknown field"),
        ({"metadata": {"user_id": "x" * 300}}, "option 'metadata': Expected `str` of length"),
        ({"service_tier": "fast"}, "option 'service_tier': Invalid enum value 'fast'"),
        ({"extra_headers": {"x-api-key": "k"}}, "option 'extra_headers': the header 'x-api-key'"),
        ({"extra_headers": {"X-A": "a\r\nb: c"}}, "option 'extra_headers': the value of header"),
        ({"extra_headers": {"bad header": "v"}}, "option 'extra_headers': 'bad header' is not"),
        ({"betas": ["Not A Beta"]}, "option 'betas': 'Not A Beta' is not a beta name"),
        ({"effort": "huge"}, "option 'effort'"),
        ({"output_format": {"type": "json"}}, "option 'output_format'"),
        (
            {"server_tools": [{"type": "web_serch_20250305"}]},
            "option 'server_tools': server tool 0: type 'web_serch_20250305' is not",
        ),
        (
            {"server_tools": [{"type": "web_search_20250305", "name": "search"}]},
            "option 'server_tools': server tool 0: a 'web_search_20250305' tool must be named "
            "'web_search', not 'search'",
        ),
        ({"server_tools": [WEB_SEARCH, WEB_SEARCH]}, "option 'server_tools': two server tools"),
        (
            {"server_tools": [{"type": "bash_20250124", "name": "bash"}]},
            "option 'server_tools': server tool 0: type 'bash_20250124' is not a server tool",
        ),
    ],
)
def test_a_bad_request_option_is_named_at_define_agent(options: dict[str, Any], named: str):
    with pytest.raises(ToolContractError, match=f"define_agent\\('a'\\): {named}"):
        define_agent(name="a", instructions=".", model="claude-x", tools={"add": TOOL}, **options)


def test_a_server_tool_named_like_a_tool_of_the_agent_is_refused():
    with pytest.raises(ToolContractError, match="the server tool 'web_search' has the name"):
        define_agent(
            name="a",
            instructions=".",
            model="claude-x",
            tools={"web_search": TOOL},
            server_tools=[WEB_SEARCH],
        )


def test_good_request_options_are_kept_as_given():
    agent = define_agent(
        name="a", instructions=".", model="claude-x", tools={"add": TOOL}, **OPTIONS
    )
    assert agent.options == OPTIONS


async def test_use_agent_checks_its_options_against_the_definitions(cluster):
    agent = define_agent(
        name="a",
        instructions=".",
        model=ScriptedModel(["hi"]),
        thinking={"type": "enabled", "budget_tokens": 2048},
        max_output_tokens=4096,
    )
    errors: list[str] = []
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        for options in ({"max_output_tokens": 2048}, {"tool_choice": {"type": "any"}}):
            try:
                ctx.use_agent(agent, **options)
            except ToolContractError as exc:
                errors.append(str(exc))
        ctx.reply("checked")

    rt = await cluster.runtime(reg)
    assert await rt.ask(URL, "go") == "checked"
    assert errors == [
        "use_agent: option 'thinking': budget_tokens (2048) must be less than "
        "max_output_tokens (2048); raise max_output_tokens",
        "use_agent: option 'tool_choice': 'any' forces a tool call, which the API refuses "
        "with thinking on; use 'auto' or 'none', or turn thinking off",
    ]


async def test_the_summary_request_of_a_compaction_calls_no_tool(cluster):
    """Server tools are declared in the summary request too (the history holds their
    blocks); tool_choice none keeps the summary from running a search. The agent's
    headers and betas go with it (a beta may be what lets the request be that long)."""
    model = ScriptedModel(lambda request: "x " * 400)
    rt = await cluster.runtime(
        app(
            model,
            context_window=2_000,
            max_output_tokens=200,
            server_tools=[WEB_SEARCH],
            betas=["context-1m-2025-08-07"],
            extra_headers={"X-Team": "a"},
        )
    )
    for n in range(6):
        await rt.ask(URL, f"turn {n}: " + "words " * 100)

    summaries = [r for r in model.requests if r.system == SUMMARY_SYSTEM]
    assert summaries, "no compaction happened"
    for request in summaries:
        assert request.tool_choice == {"type": "none"}
        assert [t["name"] for t in request.tools] == ["add", "web_search"]
        assert request.betas == ["context-1m-2025-08-07"]
        assert request.extra_headers == {"X-Team": "a"}
