"""Blocks checked before they are journaled (``blocks.py``), and a request the API
refuses as invalid not sent again, through the real anthropic SDK on a mocked
transport."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from tests.agent_apps import app
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
    Registry,
    RunFailedError,
    RunFinished,
    ToolContext,
    ToolOutcome,
    ToolResult,
    define_agent,
    define_tool,
)
from wakeful.blocks import check_tool_name, model_blocks
from wakeful.content_blocks import MAX_IMAGE_BYTES
from wakeful.errors import InvalidBlockError, ToolContractError
from wakeful.events import RunFailedNote
from wakeful.history import WITHDRAWN
from wakeful.models import AnthropicModel

pytestmark = pytest.mark.anyio

URL = "/bot/b"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'


def image(data: bytes, media_type: str) -> dict[str, Any]:
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}


class Shape(msgspec.Struct):
    name: str


class Picture(msgspec.Struct):
    data: str
    media_type: str


def painter_app(server: Server, picture: bytes, media_type: str, project: Any) -> Registry:
    async def render(ctx: ToolContext[Shape, None]) -> Picture:
        return Picture(base64.b64encode(picture).decode(), media_type)

    render_tool = define_tool(
        id="acme.render/v1",
        description="Draws a shape.",
        input=Shape,
        output=Picture,
        execute=render,
        to_model_output=project,
    )
    agent = define_agent(
        name="painter",
        instructions="You draw.",
        model=AnthropicModel(MODEL, client=server.client()),
        tools={"render": render_tool},
    )
    return app(agent)


def one_image(output: Picture) -> dict[str, Any]:  # a single block, as the README allows
    source = {"type": "base64", "media_type": output.media_type, "data": output.data}
    return {"type": "image", "source": source}


def render_call(call_id: str = "toolu_01") -> Any:
    return ok(
        stream_body(tool_block(0, call_id, "render", '{"name": "dot"}'), stop_reason="tool_use")
    )


def answer(text: str) -> Any:
    return ok(stream_body(text_block(0, text), stop_reason="end_turn"))


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


async def test_a_single_block_dict_from_to_model_output_is_sent_as_an_image(cluster):
    server = Server(render_call(), answer("A dot."))
    rt = await cluster.runtime(painter_app(server, PNG, "image/png", one_image))

    assert await rt.ask(URL, "Draw a dot.") == "A dot."

    [result] = tool_results(server.body(1))
    [block] = result["content"]
    assert block["type"] == "image" and base64.b64decode(block["source"]["data"]) == PNG
    assert "is_error" not in result


async def test_an_svg_image_is_a_tool_bug_and_never_poisons_the_conversation(cluster):
    server = Server(render_call(), answer("Back to work."))
    rt = await cluster.runtime(painter_app(server, SVG, "image/svg+xml", one_image))

    with pytest.raises(
        RunFailedError, match=r"image/svg\+xml.* is not one the API takes"
    ) as failed:
        await rt.ask(URL, "Draw a dot.")
    assert failed.value.status == "failed"
    assert len(server.requests) == 1  # the bad block was never sent
    [outcome] = [e for e in await rt.history(URL) if isinstance(e, ToolOutcome)]
    assert outcome.is_error
    assert "returned content the model cannot take" in outcome.content[0]["text"]
    [bug] = await rt.runtime_errors(URL)  # the operator gets the full error
    assert bug.tool == "render" and "image/svg+xml" in bug.detail

    # The next run goes on, without the image.
    assert await rt.ask(URL, "Something else?") == "Back to work."
    sent = json.dumps(server.body(1))
    assert '"image"' not in sent and base64.b64encode(SVG).decode() not in sent
    [result] = tool_results(server.body(1))
    assert result["is_error"] is True


async def test_a_request_refused_as_invalid_is_not_sent_again(cluster):
    refused = error_response(
        400,
        "invalid_request_error",
        "messages.2.content.0.content.0.image.source.base64: image exceeds 8000 pixels",
    )
    server = Server(render_call(), refused, answer("Fine."))
    rt = await cluster.runtime(painter_app(server, PNG, "image/png", one_image))

    with pytest.raises(RunFailedError, match="image exceeds 8000 pixels") as failed:
        await rt.ask(URL, "Draw a big dot.")
    assert "HTTP 400 invalid_request_error" in str(failed.value.error)
    assert len(server.requests) == 2  # not retried
    [note] = [e for e in await rt.history(URL) if isinstance(e, RunFailedNote)]
    assert note.withdrawn

    assert await rt.ask(URL, "Just say fine.") == "Fine."
    body = server.body(2)
    sent = json.dumps(body)
    assert '"image"' not in sent and base64.b64encode(PNG).decode() not in sent  # left out
    assert tool_results(body) == []  # and its tool call with it
    texts = [b["text"] for m in body["messages"] for b in m["content"] if b["type"] == "text"]
    assert texts[0] == "Draw a big dot."  # what was asked stays
    assert WITHDRAWN in texts
    assert any("no answer: the run failed" in t for t in texts)
    assert texts[-1] == "Just say fine."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    runs = [r.event async for r in rt.events(URL) if isinstance(r.event, RunFinished)]
    assert [r.status for r in runs] == ["failed", "completed"]


def test_a_tool_name_must_meet_the_api_rule():
    async def execute(call_id: str, params: Shape, signal: Any, on_update: Any) -> ToolResult:
        return ToolResult("")

    for bad in ("has space", "dotted.name", "x" * 65, ""):
        with pytest.raises(ToolContractError, match="1 to 64 letters, digits"):
            check_tool_name(bad)
    check_tool_name("ok_name-1")
    assert AgentTool("fine_name", ".", Shape, execute).name == "fine_name"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (image(SVG, "image/svg+xml"), "media type 'image/svg\\+xml' is not one the API takes"),
        (image(SVG, "image/png"), "the data is not a image/png image"),
        (image(PNG, "image/jpeg"), "not a image/jpeg image"),
        (
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "@@"},
            },
            "is not base64",
        ),
        (image(b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES), "image/png"), "over the API's"),
        (
            {"type": "image", "source": {"type": "url", "url": "ftp://x"}},
            "not an http or https URL",
        ),
        ({"type": "text", "text": "   "}, "non-blank 'text'"),
        ([{"type": "text", "text": "ok"}, {"type": "tool_use"}], "block 1 has type 'tool_use'"),
        (
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "text/html", "data": "eA=="},
            },
            "a base64 document is an 'application/pdf'",
        ),
        (
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "eA=="},
            },
            "not a PDF",
        ),
        (42, "must be a str, a content block"),
        (["text"], "block 0 is a str"),
    ],
)
def test_invalid_blocks_are_named_with_why(content, why):
    with pytest.raises(InvalidBlockError, match=why):
        model_blocks(content)


def test_valid_blocks_pass_as_given():
    png = image(PNG, "image/png")
    pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="},
        "title": "doc",
    }
    plain = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "hi"},
    }
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    search = {
        "type": "search_result",
        "source": "https://example.com",
        "title": "Example",
        "content": [{"type": "text", "text": "found"}],
    }
    assert model_blocks(png) == [png]
    assert model_blocks([png, pdf, plain, url, search]) == [png, pdf, plain, url, search]
    assert model_blocks("") == [{"type": "text", "text": "(empty)"}]
    assert model_blocks([]) == [{"type": "text", "text": "(empty)"}]
