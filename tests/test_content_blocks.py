"""User messages with content blocks (issue 15, item 7): images and documents sent by
a client (the client API, HTTP and the CLI) reach the Messages API request as native
blocks, through the real anthropic SDK with a mocked HTTP transport; a block the API
would refuse is refused with an error naming it, and nothing is written."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.anthropic_fakes import Server, ok, stream_body, text_block
from tests.test_cli import run
from wakeful import (
    EntityNotFoundError,
    HandlerContext,
    InvalidContentError,
    Registry,
    Runtime,
    ScriptedModel,
    Settings,
    attachment,
)
from wakeful.content_blocks import check_content, image_size
from wakeful.context_window import estimate_tokens
from wakeful.events import ConversationCompacted, LogRecord, Message, UserTurn
from wakeful.gateway import create_app
from wakeful.history import render_input

pytestmark = pytest.mark.anyio

URL = "/bot/b"


def png(width: int = 2, height: int = 3) -> bytes:
    """A real PNG (one grey pixel row per line)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\x00" + b"\x80" * width for _ in range(height)))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def jpeg(width: int = 4, height: int = 5) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n" + (
    b"2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n"
    b"3 0 obj << /Type /Page /Parent 2 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF"
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": b64(data)},
    }


def reply(text: str = "A grey square.") -> Any:
    return ok(stream_body(text_block(0, text), stop_reason="end_turn"))


def app(model: Any) -> Registry:
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="You see.", model=model)
        await ctx.agent.run()

    return reg


def user_content(server: Server, n: int = 0) -> list[dict[str, Any]]:
    content = server.body(n)["messages"][-1]["content"]
    return [{k: v for k, v in block.items() if k != "cache_control"} for block in content]


async def test_an_image_sent_by_the_client_api_reaches_the_request_as_a_native_block(cluster):
    server = Server(reply())
    rt = await cluster.runtime(app(server.model()))
    photo = attachment(png())

    assert await rt.ask(URL, "What is this?", content=[photo]) == "A grey square."

    assert user_content(server) == [{"type": "text", "text": "What is this?"}, image(png())]
    [turn] = [
        r.event
        async for r in rt.events(URL)
        if isinstance(r, LogRecord) and isinstance(r.event, UserTurn)
    ]
    assert turn.content[1] == image(png())  # journaled as the native block, not as text


async def test_documents_and_a_message_of_blocks_only(cluster, tmp_path: Path):
    server = Server(reply("Read."))
    rt = await cluster.runtime(app(server.model()))
    (tmp_path / "notes.md").write_text("# Notes\nship it")
    (tmp_path / "report.pdf").write_bytes(PDF)
    blocks = [
        attachment(tmp_path / "report.pdf", title="Q3 report"),
        attachment(tmp_path / "notes.md"),
        {
            "type": "document",
            "source": {"type": "url", "url": "https://example.com/a.pdf"},
            "citations": {"enabled": True},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]

    await rt.ask(URL, None, content=blocks)

    assert user_content(server) == [
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
            "title": "Q3 report",
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "# Notes\nship it"},
        },
        blocks[2],
        blocks[3],
    ]


SVG = b'<svg xmlns="http://www.w3.org/2000/svg"/>'


@pytest.mark.parametrize(
    ("blocks", "named"),
    [
        (
            [image(SVG, "image/svg+xml")],
            "content[0]: media type 'image/svg+xml' is not one the API takes",
        ),
        (
            [{"type": "text", "text": "ok"}, image(jpeg())],
            "content[1]: the data is not a image/png image",
        ),
        ([image(png(9000, 10))], "content[0]: the image is 9000x10 px"),
        ([image(png(), "image/gif")], "content[0]: the data is not a image/gif image"),
        (
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"},
                }
            ],
            "content[0]: 'data' is not base64",
        ),
        (
            [{**image(png()), "cache_control": {"type": "ephemeral"}}],
            "cache_control is set by the runtime",
        ),
        ([{"type": "text", "text": "  "}], "content[0]: a text block needs a non-blank 'text'"),
        ([{"type": "audio", "source": {}}], "content[0]: type 'audio' is not a content block"),
        ([{"type": "tool_result", "tool_use_id": "x"}], "content[0]: type 'tool_result' is not"),
        (
            [
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": b64(b"hello"),
                    },
                }
            ],
            "content[0]: the data is not a PDF",
        ),
        (
            [{"type": "document", "source": {"type": "url", "url": "ftp://example.com/a.pdf"}}],
            "content[0]: the source's url 'ftp://example.com/a.pdf' is not an http or https URL",
        ),
        (
            [
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                    "title": 7,
                }
            ],
            "content[0]: a document's 'title' is text",
        ),
        ([{"type": "image"}], "content[0]: a image block needs a 'source' object"),
        ("just text", "content must be a list of content blocks, got str"),
        (["a string"], "content[0]: a content block is an object, got str"),
    ],
)
async def test_an_invalid_block_is_refused_by_name_and_nothing_is_written(
    cluster, blocks: Any, named: str
):
    model = ScriptedModel(["never"])
    rt = await cluster.runtime(app(model))

    with pytest.raises(InvalidContentError) as refused:
        await rt.send(URL, "look", content=blocks)

    assert named in str(refused.value)
    with pytest.raises(EntityNotFoundError):
        await rt.status(URL)
    assert model.requests == []


async def test_the_gateway_takes_content_blocks_and_refuses_a_bad_one_with_a_422(cluster):
    server = Server(reply())
    rt = await cluster.runtime(app(server.model()))
    gateway = create_app(rt, max_body_bytes=100_000)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(gateway), base_url="http://gw"
    ) as http:
        bad = await http.post(
            "/entities/bot/b/messages",
            json={"payload": "hi", "content": [image(SVG, "image/svg+xml")]},
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["type"] == "InvalidContentError"
        assert "content[0]: media type 'image/svg+xml'" in bad.json()["error"]["message"]
        assert (await http.get("/entities/bot/b")).status_code == 404  # nothing written

        not_a_list = await http.post("/entities/bot/b/messages", json={"content": {"type": "text"}})
        assert not_a_list.status_code == 422
        missing = await http.post("/entities/bot/b/messages", json={"client_data": 1})
        assert (
            missing.status_code == 400
            and "'payload' or 'content'" in missing.json()["error"]["message"]
        )

        sent = await http.post("/entities/bot/b/messages", json={"content": [image(png())]})
        assert sent.status_code == 202, sent.text
    await rt.wait_idle(URL)
    assert user_content(server) == [image(png())]


async def test_the_cli_attaches_a_file_as_a_native_block(server_url, prefix, tmp_path: Path):
    server = Server(reply())
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4)
    rt = Runtime(app(server.model()), settings=settings, run_worker=True)
    await rt.start()
    try:
        photo = tmp_path / "photo.png"
        photo.write_bytes(png())
        sent = await run(server_url, prefix, "send", URL, "What is this?", "--file", str(photo))
        assert sent.returncode == 0, sent.stderr
        await rt.wait_idle(URL)
        assert user_content(server) == [{"type": "text", "text": "What is this?"}, image(png())]

        (tmp_path / "drawing.svg").write_bytes(SVG)
        refused = await run(
            server_url, prefix, "send", "/bot/other", "--attach", str(tmp_path / "drawing.svg")
        )
        assert refused.returncode == 1
        assert (
            "drawing.svg: media type 'image/svg+xml' is not one the API takes for images"
            in refused.stderr
        )
        assert "Traceback" not in refused.stderr
        missing = await run(
            server_url, prefix, "send", "/bot/other", "--file", str(tmp_path / "nope.png")
        )
        assert missing.returncode == 1 and "nope.png: cannot read it" in missing.stderr
        empty = await run(server_url, prefix, "send", "/bot/other")
        assert empty.returncode == 1 and "give the message's text" in empty.stderr
        with pytest.raises(EntityNotFoundError):
            await rt.status("/bot/other")
    finally:
        await rt.close()


def test_a_bad_block_in_the_log_is_left_out_with_a_note_not_sent():
    record = LogRecord(
        id="1-0",
        event=Message(
            payload="see", content=[{"type": "image", "source": {"type": "s3", "key": "f"}}]
        ),
    )
    assert render_input(record) == [
        {"type": "text", "text": "see"},
        {
            "type": "text",
            "text": "[an attachment was left out: content[0]: an image source is 'base64', 'url' or "
            "'file', got 's3']",
        },
    ]


def test_image_sizes_are_read_from_their_headers():
    assert image_size(png(7, 9), "image/png") == (7, 9)
    assert image_size(jpeg(640, 480), "image/jpeg") == (640, 480)
    assert image_size(b"GIF89a" + struct.pack("<HH", 12, 34), "image/gif") == (12, 34)
    vp8x = (
        b"RIFF\x00\x00\x00\x00WEBPVP8X"
        + b"\x00" * 8
        + (99).to_bytes(3, "little")
        + (49).to_bytes(3, "little")
    )
    assert image_size(vp8x, "image/webp") == (100, 50)
    assert image_size(png(), "image/jpeg") is None
    assert check_content([image(jpeg(), "image/jpeg")])[0]["source"]["media_type"] == "image/jpeg"


def test_an_image_is_counted_at_its_token_cost_not_its_base64_length():
    big = image(png(800, 600) + b"\x00" * 600_000)  # ~800 KB of base64
    message = [{"role": "user", "content": [{"type": "text", "text": "what?"}, big]}]
    assert estimate_tokens(message) < 2_000


async def test_a_big_image_does_not_set_off_compaction(cluster):
    model = ScriptedModel(lambda request: "ok")
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent("You see.", model, context_window=40_000, max_output_tokens=1000)
        await ctx.agent.run()

    rt = await cluster.runtime(reg, max_event_bytes=2_000_000)
    for text in ("one", "two", "three"):
        await rt.ask(URL, text)
    await rt.ask(URL, "and this?", content=[image(png(1000, 1000) + b"\x00" * 400_000)])

    compactions = [
        r
        async for r in rt.events(URL)
        if isinstance(r, LogRecord) and isinstance(r.event, ConversationCompacted)
    ]
    assert compactions == []
    assert model.requests[-1].messages[-1]["content"][-1]["type"] == "image"


def test_attachment_names_the_file_it_refuses(tmp_path: Path):
    (tmp_path / "tiny.png").write_bytes(png(9001, 1))
    with pytest.raises(InvalidContentError, match=r"tiny.png: the image is 9001x1 px"):
        attachment(tmp_path / "tiny.png")
    with pytest.raises(InvalidContentError, match="only a document takes a title"):
        attachment(png(), title="x")


async def test_the_transcript_shows_attachments_by_kind(cluster):
    from wakeful.transcript import history_lines, lines

    model = ScriptedModel(["seen"])
    rt = await cluster.runtime(app(model))
    await rt.ask(URL, "look", content=[image(png()), attachment(PDF, title="Q3")])

    shown = [line for r in [r async for r in rt.events(URL)] for line in lines(r)]
    # (escaped for the terminal's markup: "\\[" shows as "[")
    assert any("from a client: look \\[image] \\[document: Q3]" in line for line in shown), shown
    history = history_lines(await rt.history(URL))
    assert [line.rsplit("[/]", 1)[-1].strip() for line in history[:3]] == [
        "look",
        "\\[image]",
        "\\[document: Q3]",
    ]


def test_attachment_names_a_file_of_another_kind(tmp_path: Path):
    (tmp_path / "data.json").write_text("{}")
    with pytest.raises(
        InvalidContentError,
        match=r"data.json: not an image .*, a PDF or a text file \(it is application/json\)",
    ):
        attachment(tmp_path / "data.json")
    with pytest.raises(InvalidContentError, match="bytes: not an image"):
        attachment(b"\x00\x01")
