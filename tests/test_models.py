"""The model layer: AnthropicModel through the real SDK over a mocked HTTP transport
(recorded server-sent-event streams, no network), ScriptedModel, resolve_model."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from tests.anthropic_fakes import (
    MODEL,
    SSE_HEADERS,
    Server,
    error_response,
    message_start,
    ok,
    sse,
    stream_body,
    text_block,
    tool_block,
)
from wakeful.models import (
    AnthropicModel,
    Model,
    ModelConfigError,
    ModelError,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    Usage,
    resolve_model,
)

pytestmark = pytest.mark.anyio


# --- helpers ------------------------------------------------------------------------


def request(**overrides: Any) -> ModelRequest:
    fields: dict[str, Any] = {
        "model": MODEL,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
    }
    fields.update(overrides)
    return ModelRequest(**fields)


# --- AnthropicModel: responses ------------------------------------------------------


async def test_text_streams_deltas_in_order_and_reports_usage() -> None:
    body = stream_body(
        text_block(0, "Two plus ", "two is ", "four."),
        stop_reason="end_turn",
        output_tokens=9,
        input_tokens=14,
        cache_creation=300,
        cache_read=2048,
    )
    server = Server(ok(body))
    deltas: list[str] = []

    response = await server.model().complete(request(), on_text=deltas.append)

    assert deltas == ["Two plus ", "two is ", "four."]
    assert response.content == [{"type": "text", "text": "Two plus two is four."}]
    assert response.stop_reason == "end_turn"
    assert response.model == MODEL
    assert response.usage == Usage(
        input_tokens=14,
        output_tokens=9,
        cache_creation_input_tokens=300,
        cache_read_input_tokens=2048,
    )
    assert response.usage.total_tokens == 14 + 9 + 300 + 2048


async def test_one_tool_call() -> None:
    body = stream_body(
        text_block(0, "Let me look."),
        tool_block(1, "toolu_01A", "get_weather", '{"loc', 'ation": "Paris"', ', "unit": "c"}'),
        stop_reason="tool_use",
    )
    server = Server(ok(body))

    response = await server.model().complete(request())

    assert response.stop_reason == "tool_use"
    assert response.content == [
        {"type": "text", "text": "Let me look."},
        {
            "type": "tool_use",
            "id": "toolu_01A",
            "name": "get_weather",
            "input": {"location": "Paris", "unit": "c"},
        },
    ]
    json.dumps(response.content)  # plain, JSON-able dicts


async def test_parallel_tool_calls() -> None:
    body = stream_body(
        tool_block(0, "toolu_01A", "read_file", '{"path": ', '"a.txt"}'),
        tool_block(1, "toolu_01B", "read_file", '{"path": "b.txt", "lines": [1, 2]}'),
        tool_block(2, "toolu_01C", "list_dir"),  # no input_json_delta at all: empty input
        stop_reason="tool_use",
    )
    server = Server(ok(body))

    response = await server.model().complete(request())

    calls = [(b["id"], b["name"], b["input"]) for b in response.content]
    assert calls == [
        ("toolu_01A", "read_file", {"path": "a.txt"}),
        ("toolu_01B", "read_file", {"path": "b.txt", "lines": [1, 2]}),
        ("toolu_01C", "list_dir", {}),
    ]


async def test_max_tokens_stop() -> None:
    server = Server(ok(stream_body(text_block(0, "Once upon a"), stop_reason="max_tokens")))

    response = await server.model().complete(request(max_tokens=3))

    assert response.stop_reason == "max_tokens"
    assert response.content == [{"type": "text", "text": "Once upon a"}]
    assert server.body()["max_tokens"] == 3


async def test_request_carries_cache_breakpoints_and_leaves_the_caller_alone() -> None:
    tools = [
        {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}},
        {
            "name": "list_dir",
            "description": "List a directory.",
            "input_schema": {"type": "object"},
        },
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": {"path": "a.txt"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"},
                {"type": "text", "text": "Summarise it."},
            ],
        },
    ]
    req = request(messages=messages, tools=tools, max_tokens=1000)
    before = copy.deepcopy(req)
    server = Server(ok(stream_body(text_block(0, "ok"), stop_reason="end_turn")))

    await server.model().complete(req)

    sent = server.body()
    ephemeral = {"type": "ephemeral"}
    assert sent["model"] == MODEL
    assert sent["max_tokens"] == 1000
    assert sent["stream"] is True
    assert sent["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": ephemeral}
    ]
    assert "cache_control" not in sent["tools"][0]
    assert sent["tools"][1] == {**tools[1], "cache_control": ephemeral}
    assert sent["messages"][:2] == messages[:2]
    last = sent["messages"][2]["content"]
    assert last[0] == messages[2]["content"][0]
    assert last[1] == {"type": "text", "text": "Summarise it.", "cache_control": ephemeral}
    assert req == before


async def test_empty_system_and_no_tools_are_left_out() -> None:
    server = Server(ok(stream_body(text_block(0, "ok"), stop_reason="end_turn")))

    await server.model().complete(request(system="", messages=[{"role": "user", "content": "hi"}]))

    sent = server.body()
    assert "system" not in sent
    assert "tools" not in sent
    assert sent["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        }
    ]


# --- AnthropicModel: failures -------------------------------------------------------


async def test_429_is_retried_by_the_sdk_then_succeeds() -> None:
    server = Server(
        error_response(
            429, "rate_limit_error", "Number of requests exceeded", **{"retry-after-ms": "1"}
        ),
        ok(stream_body(text_block(0, "fine"), stop_reason="end_turn")),
    )

    response = await server.model(max_retries=2).complete(request())

    assert len(server.requests) == 2
    assert response.content == [{"type": "text", "text": "fine"}]


async def test_500_after_retries_is_a_retryable_model_error() -> None:
    server = Server(error_response(500, "api_error", "Internal server error"))

    with pytest.raises(ModelError) as info:
        await server.model(max_retries=0).complete(request())

    err = info.value
    assert err.retryable is True
    assert err.status_code == 500
    assert err.error_type == "api_error"
    assert MODEL in str(err)
    assert "HTTP 500" in str(err)
    assert "req_err" in str(err)


async def test_400_is_not_retried_and_not_retryable() -> None:
    server = Server(error_response(400, "invalid_request_error", "max_tokens: must be positive"))

    with pytest.raises(ModelError) as info:
        await server.model(max_retries=2).complete(request())

    err = info.value
    assert len(server.requests) == 1
    assert err.retryable is False
    assert err.status_code == 400
    assert "HTTP 400 invalid_request_error: max_tokens: must be positive" in str(err)


async def test_error_event_mid_stream_is_retryable_by_its_type() -> None:
    body = sse(
        message_start(),
        *text_block(0, "Hal"),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    server = Server(ok(body))

    with pytest.raises(ModelError) as info:
        await server.model(max_retries=2).complete(request())

    assert len(server.requests) == 1  # already streaming: the SDK cannot retry
    assert info.value.retryable is True
    assert info.value.error_type == "overloaded_error"
    assert "error event in the response stream overloaded_error: Overloaded" in str(info.value)


async def test_stream_cut_before_message_stop_is_retryable() -> None:
    server = Server(ok(sse(message_start(), *text_block(0, "Half an ans"))))

    with pytest.raises(ModelError, match="ended before message_stop") as info:
        await server.model().complete(request())

    assert info.value.retryable is True


class BrokenStream(httpx2.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield sse(message_start(), *text_block(0, "Hi"))
        raise httpx2.ReadError("connection reset by peer")


async def test_transport_error_while_streaming_is_retryable() -> None:
    # The SDK wraps transport errors of the request only; reading the stream raises raw httpx2 errors.
    server = Server(httpx2.Response(200, headers=SSE_HEADERS, stream=BrokenStream()))

    with pytest.raises(ModelError, match="ReadError while reading the response stream") as info:
        await server.model().complete(request())

    assert info.value.retryable is True


async def test_connection_error_is_retryable() -> None:
    def refuse() -> httpx2.Response:
        raise httpx2.ConnectError("connection refused")

    server = Server(refuse)

    with pytest.raises(ModelError, match="connection error") as info:
        await server.model(max_retries=0).complete(request())

    assert info.value.retryable is True


# --- AnthropicModel: cancellation ---------------------------------------------------


class HangingStream(httpx2.AsyncByteStream):
    """Sends one chunk of events, then never another byte."""

    def __init__(self, first: bytes) -> None:
        self.first = first
        self.finished = False  # the generator's finally ran
        self.closed = False  # the transport stream was closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            yield self.first
            await asyncio.Event().wait()
        finally:
            self.finished = True

    async def aclose(self) -> None:
        self.closed = True


async def test_cancel_closes_the_stream_and_propagates() -> None:
    stream = HangingStream(
        sse(message_start(), text_block(0, "Thinking")[0], text_block(0, "Thinking")[1])
    )
    response = httpx2.Response(200, headers=SSE_HEADERS, stream=stream)
    server = Server(response)
    first_text = asyncio.Event()

    task = asyncio.create_task(
        server.model().complete(request(), on_text=lambda _: first_text.set())
    )
    await asyncio.wait_for(first_text.wait(), 5)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.finished
    assert stream.closed
    assert response.is_closed


# --- configuration ------------------------------------------------------------------


def test_missing_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    with pytest.raises(
        ModelConfigError,
        match=r"ANTHROPIC_API_KEY is not set; needed for model 'claude-sonnet-4-6'",
    ):
        AnthropicModel()
    with pytest.raises(ModelConfigError, match="ANTHROPIC_API_KEY"):
        resolve_model("claude-sonnet-4-6")


def test_resolve_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    scripted = ScriptedModel(["hi"])

    assert resolve_model(scripted) is scripted
    claude = resolve_model("claude-haiku-4-5")
    assert isinstance(claude, AnthropicModel)
    assert claude.name == "claude-haiku-4-5"
    assert isinstance(claude, Model)
    with pytest.raises(ModelConfigError, match=r"unknown model 'gpt-4'.*'claude-'"):
        resolve_model("gpt-4")
    with pytest.raises(ModelConfigError, match="neither a model name nor a Model"):
        resolve_model(42)  # type: ignore[arg-type]


def test_usage_adds_field_wise() -> None:
    a = Usage(
        input_tokens=1, output_tokens=2, cache_creation_input_tokens=3, cache_read_input_tokens=4
    )
    b = Usage(
        input_tokens=10,
        output_tokens=20,
        cache_creation_input_tokens=30,
        cache_read_input_tokens=40,
    )

    assert a + b == Usage(
        input_tokens=11,
        output_tokens=22,
        cache_creation_input_tokens=33,
        cache_read_input_tokens=44,
    )
    assert (a + b).total_tokens == 110
    assert Usage().total_tokens == 0
    assert ModelResponse(content=[], stop_reason="end_turn").usage == Usage()


# --- ScriptedModel ------------------------------------------------------------------


async def test_scripted_serves_in_order_with_str_shorthand() -> None:
    model = ScriptedModel(["first", ScriptedModel.text("second")])

    one = await model.complete(request())
    two = await model.complete(request())

    assert one.content == [{"type": "text", "text": "first"}]
    assert one.stop_reason == "end_turn"
    assert one.model == "scripted"
    assert two.content == [{"type": "text", "text": "second"}]
    assert len(model.requests) == 2


async def test_scripted_exhaustion_is_a_model_error() -> None:
    model = ScriptedModel(["only"])
    await model.complete(request())

    with pytest.raises(ModelError) as info:
        await model.complete(request())

    assert str(info.value) == "script of model 'scripted' has no response left for call 2"
    assert info.value.retryable is False
    assert len(model.requests) == 2


async def test_scripted_callables() -> None:
    def echo(req: ModelRequest) -> str:
        return f"you said {req.messages[-1]['content'][0]['text']}"

    async def later(req: ModelRequest) -> ModelResponse:
        return ScriptedModel.text(f"call with {len(req.messages)} messages")

    listed = ScriptedModel([echo, later])
    assert (await listed.complete(request())).content[0]["text"] == "you said What is 2+2?"
    assert (await listed.complete(request())).content[0]["text"] == "call with 1 messages"

    forever = ScriptedModel(echo)
    for _ in range(3):
        assert (await forever.complete(request())).content[0]["text"] == "you said What is 2+2?"
    assert len(forever.requests) == 3


async def test_scripted_callable_can_fail_the_call() -> None:
    def overloaded(req: ModelRequest) -> str:
        raise ModelError("model 'scripted' call failed: overloaded", retryable=True)

    model = ScriptedModel([overloaded, "recovered"])

    with pytest.raises(ModelError, match="overloaded"):
        await model.complete(request())
    assert (await model.complete(request())).content[0]["text"] == "recovered"


async def test_scripted_assigns_tool_use_ids_when_served() -> None:
    calls = ScriptedModel.tool_calls(
        ("read_file", {"path": "a"}), ("read_file", {"path": "b"}), text="Reading."
    )
    assert [b.get("id") for b in calls.content] == [None, "", ""]
    assert calls.stop_reason == "tool_use"
    fixed = ModelResponse(
        content=[{"type": "tool_use", "id": "toolu_mine", "name": "x", "input": {}}],
        stop_reason="tool_use",
    )
    model = ScriptedModel(lambda req: calls if len(model.requests) == 1 else fixed)

    one = await model.complete(request())
    two = await model.complete(request())

    assert [b["id"] for b in one.content if b["type"] == "tool_use"] == ["toolu_1_0", "toolu_1_1"]
    assert one.content[1]["input"] == {"path": "a"}
    assert two.content[0]["id"] == "toolu_mine"
    assert calls.content[1]["id"] == ""  # the script's response is left alone


async def test_scripted_records_snapshots_of_requests() -> None:
    model = ScriptedModel(["a", "b"])
    req = request()

    await model.complete(req)
    req.messages.append({"role": "assistant", "content": [{"type": "text", "text": "a"}]})
    await model.complete(req)

    assert [len(r.messages) for r in model.requests] == [1, 2]


async def test_scripted_streams_chunks_and_reports_usage() -> None:
    model = ScriptedModel([ScriptedModel.tool_calls(("f", {}), text="Hello big  world")])
    chunks: list[str] = []

    response = await model.complete(request(), on_text=chunks.append)

    assert chunks == ["Hello ", "big ", " ", "world"]
    assert "".join(chunks) == "Hello big  world"
    assert response.usage.input_tokens >= 1
    assert response.usage.output_tokens >= 2  # one per block at least
    explicit = Usage(input_tokens=7, output_tokens=3)
    served = await ScriptedModel(
        [ModelResponse(content=[], stop_reason="end_turn", usage=explicit)]
    ).complete(request())
    assert served.usage == explicit


async def test_scripted_is_cancellable_mid_stream() -> None:
    model = ScriptedModel(["one two three four"])
    chunks: list[str] = []

    def on_text(chunk: str) -> None:
        chunks.append(chunk)
        if len(chunks) == 2:
            task.cancel()

    task = asyncio.create_task(model.complete(request(), on_text=on_text))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert chunks == ["one ", "two "]
