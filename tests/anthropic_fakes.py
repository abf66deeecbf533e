"""Fakes of the Messages API for tests: recorded server-sent-event streams, a
``Server`` that answers the real anthropic SDK through ``httpx2.MockTransport``
(no network, no API key), and a ``bot`` whose agent talks to it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2

from wakeful import HandlerContext, Registry
from wakeful.models import AnthropicModel

MODEL = "claude-sonnet-4-6"
SSE_HEADERS = {"content-type": "text/event-stream", "request-id": "req_test"}


# --- recorded streams ---------------------------------------------------------------


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events
    )


def message_start(
    input_tokens: int = 25, cache_creation: int = 0, cache_read: int = 0
) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": cache_creation,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
            },
        },
    }


def text_block(index: int, *deltas: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": d},
            }
            for d in deltas
        ),
        {"type": "content_block_stop", "index": index},
    ]


def tool_block(index: int, id: str, name: str, *json_parts: str) -> list[dict[str, Any]]:
    start = {"type": "tool_use", "id": id, "name": name, "input": {}}
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }
            for part in json_parts
        ),
        {"type": "content_block_stop", "index": index},
    ]


def message_end(
    stop_reason: str,
    output_tokens: int,
    *,
    stop_sequence: str | None = None,
    stop_details: dict[str, Any] | None = None,
    server_tool_use: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    delta: dict[str, Any] = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
    if stop_details is not None:
        delta["stop_details"] = stop_details
    usage: dict[str, Any] = {"output_tokens": output_tokens}
    if server_tool_use is not None:
        usage["server_tool_use"] = server_tool_use
    return [
        {"type": "message_delta", "delta": delta, "usage": usage},
        {"type": "message_stop"},
    ]


def stream_body(
    *blocks: list[dict[str, Any]],
    stop_reason: str,
    output_tokens: int = 12,
    stop_sequence: str | None = None,
    stop_details: dict[str, Any] | None = None,
    server_tool_use: dict[str, int] | None = None,
    **start: int,
) -> bytes:
    events = [message_start(**start), {"type": "ping"}]
    for block in blocks:
        events += block
    end = message_end(
        stop_reason,
        output_tokens,
        stop_sequence=stop_sequence,
        stop_details=stop_details,
        server_tool_use=server_tool_use,
    )
    return sse(*events, *end)


def ok(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=body, headers=SSE_HEADERS)


def error_response(status: int, error_type: str, message: str, **headers: str) -> httpx2.Response:
    body = {"type": "error", "error": {"type": error_type, "message": message}}
    return httpx2.Response(status, json=body, headers={"request-id": "req_err", **headers})


# --- the server ---------------------------------------------------------------------


class Server:
    """Serves scripted responses to the real SDK client and records what it was sent."""

    def __init__(self, *responses: httpx2.Response | Callable[[], httpx2.Response]) -> None:
        self.responses = list(responses)
        self.requests: list[httpx2.Request] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        response = self.responses.pop(0)
        return response() if callable(response) else response

    def client(self, max_retries: int = 0) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key="test",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)),
            max_retries=max_retries,
        )

    def model(self, max_retries: int = 0) -> AnthropicModel:
        return AnthropicModel(MODEL, client=self.client(max_retries))

    def body(self, n: int = 0) -> dict[str, Any]:
        return json.loads(self.requests[n].content)


def bot_app(server: Server, results: list[Any] | None = None, **options: Any) -> Registry:
    """``bot``: each wake runs an agent ("You answer.", no tools, ``use_agent`` options)
    on the real SDK through ``server``; ``results`` collects each run's result."""
    client = server.client()
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(
            system_prompt="You answer.",
            model=AnthropicModel(MODEL, client=client),
            tools=[],
            **options,
        )
        result = await ctx.agent.run()
        if results is not None:
            results.append(result)

    return reg
