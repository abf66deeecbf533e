"""Input from outside, as an attacker sends it: client schemas that reach for files,
the network or a catastrophic regex, and JSON that is not quite JSON (issue 13)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_apps import http_for
from wakeful import Collection, HandlerContext, Registry, ScriptedModel
from wakeful.actions import (
    ActionValidationError,
    ClientToolsError,
    check_answer,
    check_client_tools,
)
from wakeful.config import Settings
from wakeful.errors import EntityNotFoundError, InvalidPayloadError
from wakeful.events import ActionRequested
from wakeful.models import ModelResponse

pytestmark = pytest.mark.anyio
SECRET = "the-secret-content-1f4e"
ROOT = Path(__file__).resolve().parents[1]


def registry() -> Registry:
    reg = Registry()
    call = {"type": "tool_use", "id": "p1", "name": "probe", "input": {}}

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        model = ScriptedModel([ModelResponse(content=[call], stop_reason="tool_use"), "Done."])
        ctx.use_agent(system_prompt="", model=model, tools=[])
        await ctx.agent.run()

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(f"echo {m.payload}")

    @reg.entity("gauge", state={"readings": Collection("key")})
    async def gauge(ctx: HandlerContext) -> None:  # a handler's own NaN, kept as it is
        ctx.db.actions.readings_insert(row={"key": "r", "value": float("nan")})

    return reg


async def gateway(cluster: Any) -> tuple[httpx.AsyncClient, Any]:
    rt = await cluster.runtime(registry())
    return http_for(rt), rt


def probe(output_schema: Any) -> list[dict[str, Any]]:
    return [{"name": "probe", "input_schema": {"type": "object"}, "output_schema": output_schema}]


@pytest.fixture
def secret_file(tmp_path: Any) -> str:
    path = tmp_path / "secret.json"
    path.write_text(json.dumps({"type": "string", "description": SECRET}))
    return path.as_uri()


@pytest.fixture
def web() -> Iterator[tuple[str, list[str]]]:
    """A local web server serving a schema, recording every path it is asked for."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = json.dumps({"type": "string", "description": SECRET}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", hits
    finally:
        server.shutdown()
        thread.join()


# -- 4. client schemas never reach the disk or the network ---------------------------


async def test_a_client_schema_referring_to_a_file_is_refused_naming_the_ref(cluster, secret_file):
    http, rt = await gateway(cluster)
    async with http:
        sent = await http.post(
            "/entities/bot/b/messages",
            json={"payload": "hi", "client_tools": probe({"$ref": secret_file})},
        )
    assert sent.status_code == 422
    message = sent.json()["error"]["message"]
    assert secret_file in message and "outside the schema" in message
    assert SECRET not in message
    with pytest.raises(EntityNotFoundError):
        await rt.status("/bot/b")  # nothing was written


async def test_a_client_schema_referring_to_a_url_is_refused_without_fetching_it(cluster, web):
    url, hits = web
    http, _ = await gateway(cluster)
    async with http:
        nested = {"type": "object", "properties": {"x": {"$ref": url}}}
        sent = await http.post(
            "/entities/bot/b/messages", json={"payload": "hi", "client_tools": probe(nested)}
        )
    assert sent.status_code == 422 and url in sent.json()["error"]["message"]
    assert hits == []


def test_a_stored_schema_with_a_remote_ref_resolves_nothing_when_an_answer_is_checked(
    secret_file, web
):
    """Schemas journaled before the submission checks existed are evaluated safely too."""
    url, hits = web
    for ref in (secret_file, url):
        action = ActionRequested(
            run_id="r",
            tool_call_id="c1",
            tool="probe",
            kind="client",
            output_schema={"$ref": ref},
        )
        with pytest.raises(ActionValidationError) as refused:
            check_answer(action, "/bot/b", "c1", "output", output="x")
        assert SECRET not in str(refused.value)
    assert hits == []


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        (
            [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(65)],
            "65 tools, over the limit of 64",
        ),
        (
            probe({"type": "string", "description": "x" * 70_000}),
            "over the limit of 65536",
        ),
    ],
)
def test_client_tool_snapshots_are_capped(snapshot, message):
    with pytest.raises(ClientToolsError, match=message):
        check_client_tools(snapshot)


def test_a_client_schema_nested_too_deeply_is_refused():
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        schema = {"not": schema}
    with pytest.raises(ClientToolsError, match="nested deeper than 32 levels"):
        check_client_tools(probe(schema))
    # The limits are settings.
    check_client_tools(probe(schema), Settings(max_schema_depth=50))


# -- 5. patterns run in bounded time -------------------------------------------------


async def test_a_catastrophic_pattern_is_evaluated_correctly_without_blocking(cluster):
    """``^(a+)+$`` backtracks exponentially on Python's re; here it is answered at once."""
    hostile = "^(a+)+$"
    schema = {
        "type": "object",
        "properties": {"v": {"type": "string", "pattern": hostile}},
        "patternProperties": {hostile: {"type": "integer"}},
        "additionalProperties": False,
    }
    http, rt = await gateway(cluster)
    async with http:
        sent = await http.post(
            "/entities/bot/b/messages", json={"payload": "hi", "client_tools": probe(schema)}
        )
        assert sent.status_code == 202
        await rt.wait_idle("/bot/b")
        submit = "/entities/bot/b/actions/p1/submit"
        attack = "a" * 40 + "!"
        value = await http.post(submit, json={"output": {"v": attack}})
        assert value.status_code == 422 and "does not match" in value.json()["error"]["message"]
        key = await http.post(submit, json={"output": {attack: 1}})
        assert key.status_code == 422 and "unexpected" in key.json()["error"]["message"]
        assert len(await rt.pending_actions("/bot/b")) == 1  # refused: still pending
        ok = await http.post(submit, json={"output": {"v": "aaaa", "aaa": 3}})
        assert ok.status_code == 200
    status = await rt.wait_idle("/bot/b")
    assert status.pending_actions == 0


# -- 6. strict JSON ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"args": NaN}', "NaN and Infinity are not JSON"),
        (b'{"args": {"x": -Infinity}}', "NaN and Infinity are not JSON"),
        (b'{"args": 1' + b"0" * 5000 + b"}", "not valid JSON"),
        (b'{"args": 1' + b"0" * 1000 + b"}", "out of range"),
        (b'{"args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper than 64"),
        (b'{"args": ' + b"[" * 70 + b"]" * 70 + b"}", "nested deeper than 64"),
    ],
)
async def test_a_body_that_is_not_strict_json_is_400_and_writes_nothing(cluster, body, named):
    http, _ = await gateway(cluster)
    async with http:
        created = await http.post(
            "/entities/echo/e", content=body, headers={"content-type": "application/json"}
        )
        assert created.status_code == 400, created.text
        error = created.json()["error"]
        assert error["type"] == "MalformedJSON" and named in error["message"]
        assert (await http.get("/entities/echo/e")).status_code == 404


@pytest.mark.parametrize(
    ("query", "headers", "named"),
    [
        ("tail=²", {}, "tail"),  # a digit to str.isdigit(), not to int()
        ("tail=1" + "0" * 5000, {}, "tail"),
        ("after=garbage", {}, "after"),
        ("after=1-0|x-y", {}, "after"),
        ("after=99999999999999999999999-0", {}, "after"),
        ("", {"last-event-id": "not-a-position"}, "Last-Event-ID"),
        ("live=maybe", {}, "live"),
    ],
)
async def test_a_malformed_event_stream_query_is_400_before_the_stream_starts(
    cluster, query, headers, named
):
    http, rt = await gateway(cluster)
    await rt.send("/echo/e", "hi")
    async with http:
        stream = await http.get(f"/entities/echo/e/events?follow=0&{query}", headers=headers)
    assert stream.status_code == 400, stream.text
    assert stream.headers["content-type"] == "application/json"
    assert named in stream.json()["error"]["message"]


async def test_a_malformed_listing_limit_is_400(cluster):
    http, _ = await gateway(cluster)
    async with http:
        for limit in ("²", "1" + "0" * 5000, "-1"):
            listing = await http.get(f"/entities/echo?limit={limit}")
            assert listing.status_code == 400 and "limit" in listing.json()["error"]["message"]


async def test_the_client_api_refuses_what_json_cannot_carry(cluster):
    rt = await cluster.runtime(registry())
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    for payload, named in (
        (float("nan"), "nan at $.payload"),
        ({"x": [1, float("inf")]}, "inf at $.payload.x[1]"),
        (deep, "nested deeper than 64"),
    ):
        with pytest.raises(
            InvalidPayloadError, match=named.replace("$", r"\$").replace("[", r"\[")
        ):
            await rt.send("/echo/e", payload)
        with pytest.raises(InvalidPayloadError):
            await rt.create("echo", "e", {"args": payload})
    with pytest.raises(EntityNotFoundError):
        await rt.status("/echo/e")  # nothing was written


async def test_a_handlers_nan_is_served_as_valid_json(cluster):
    """What the runtime stores from a handler is kept; its readers still get JSON."""
    http, rt = await gateway(cluster)
    await rt.send("/gauge/g", "read")
    await rt.wait_idle("/gauge/g")

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}"))

    async with http:
        state = await http.get("/entities/gauge/g/state")
        assert state.status_code == 200
        assert strict(state.text) == {"readings": [{"key": "r", "value": None}]}
        stream = await http.get("/entities/gauge/g/events?follow=0")
    data = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
    assert data and all(strict(d) for d in data)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("NaN", "NaN and Infinity are not JSON"),
        ('{"a": 1' + "0" * 30 + "}", "out of range"),
        ("[" * 50_000 + "]" * 50_000, "nested deeper than 64"),  # argv caps one arg at 128 KiB
    ],
)
def test_cli_input_is_strict_json(value, named):
    """Parsed before any connection: a bad --input never reaches Redis (none runs here)."""
    result = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", "approve", "/notes/n", "c1", "--input", value],
        cwd=ROOT,
        env={**os.environ, "WAKEFUL_REDIS_URL": "redis://127.0.0.1:1/0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "--input" in result.stderr and named in result.stderr
    assert "Traceback" not in result.stderr
