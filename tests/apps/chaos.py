"""The entity types of the chaos run (``tests/apps/chaos_run.py``).

Run by worker subprocesses as ``tests.apps.chaos:registry``. Every handler counts
what it applies instead of refusing a repeat, so a duplicate shows up in the state
(``n > 1``) rather than as a failed wake:

* ``tally``: a message ``{"k": key, "v": int}`` adds a ``seen`` row (``n`` counts
  applications) and ``v`` to ``totals`` (after ``"sleep"`` seconds, if given); with ``"timer": {"tag", "after"}`` it also
  sends itself ``{"fired": tag}`` as a durable timer, counted in ``fired``.
* ``parent``: a message ``{"k": key, "kids": n}`` spawns ``n`` ``kid`` children
  ``<parent id>.<key>.<j>`` with a ``run_finished`` subscription; each finished run
  is counted in ``reports`` (keyed by the child's url, with its response).
* ``kid``: replies ``done <its message>``, which finishes its run.
* ``agent``: an agent run with a :class:`ScriptedModel`: for every ``note:<key>:<a>:<b>``
  in the user's messages not called yet, the model calls the tool ``note`` (call id
  ``note_<key>``, so a repeated model request answers the same), which counts the key
  in ``notes`` and returns ``a + b``; then the model answers ``noted``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec

from wakeful import (
    AgentTool,
    Collection,
    HandlerContext,
    Registry,
    ScriptedModel,
    ToolResult,
    Wake,
)
from wakeful.models import ModelRequest, ModelResponse


class Seen(msgspec.Struct):
    key: str
    v: int
    n: int


class Total(msgspec.Struct):
    key: str
    n: int
    sum: int


class Fired(msgspec.Struct):
    tag: str
    n: int


class Report(msgspec.Struct):
    child: str
    response: str
    n: int


class Note(msgspec.Struct):
    key: str
    result: str
    n: int


class NoteArgs(msgspec.Struct):
    key: str
    a: int
    b: int


NOTE = re.compile(r"note:([A-Za-z0-9]+):(\d+):(\d+)")

registry = Registry()


def _count(handle: Any, key: str, row: msgspec.Struct) -> None:
    """Insert ``row`` or count one more application of ``key``."""
    if key in handle:
        handle.update(key, lambda r: setattr(r, "n", r.n + 1))
    else:
        handle.insert(row)


@registry.entity(
    "tally",
    description="counts keyed messages and fired timers",
    state={
        "seen": Collection(primary_key="key", row=Seen),
        "totals": Collection(row=Total),
        "fired": Collection(primary_key="tag", row=Fired),
    },
)
async def tally(ctx: HandlerContext) -> None:
    seen = ctx.db.collection("seen", Seen)
    totals = ctx.db.collection("totals", Total)
    fired = ctx.db.collection("fired", Fired)
    for message in ctx.wake.messages:
        payload = message.payload
        if "fired" in payload:
            _count(fired, payload["fired"], Fired(payload["fired"], 1))
            continue
        if payload.get("sleep"):  # a slow wake, so a paused worker is caught mid-wake
            await asyncio.sleep(payload["sleep"])
        _count(seen, payload["k"], Seen(payload["k"], payload["v"], 1))
        if "all" in totals:
            totals.update("all", lambda t, v=payload["v"]: Total("all", t.n + 1, t.sum + v))
        else:
            totals.insert(Total("all", 1, payload["v"]))
        if timer := payload.get("timer"):
            await ctx.send(ctx.entity_url, {"fired": timer["tag"]}, after=timer["after"])


@registry.entity(
    "parent",
    description="spawns children and counts their reports",
    state={"reports": Collection(primary_key="child", row=Report)},
)
async def parent(ctx: HandlerContext) -> None:
    for message in ctx.wake.messages:
        key = message.payload["k"]
        for j in range(message.payload["kids"]):
            await ctx.spawn(
                "kid",
                f"{ctx.entity_id}.{key}.{j}",
                initial_message=f"{key}.{j}",
                wake=Wake.run_finished(include_response=True),
            )
    reports = ctx.db.collection("reports", Report)
    for finished in ctx.wake.runs_finished:
        _count(reports, finished.child, Report(finished.child, finished.response or "", 1))


@registry.entity("kid", description="answers its parent")
async def kid(ctx: HandlerContext) -> None:
    for message in ctx.wake.messages:
        ctx.reply(f"done {message.payload}")


def _respond(request: ModelRequest) -> ModelResponse:
    """Call ``note`` for every ``note:`` in the user's messages that no earlier step
    called yet, then answer. Looking at the whole conversation, not only its last
    message, also covers a message that arrived while a step's tools ran (it joins
    the turn that carries their results)."""
    called = {
        block["id"]
        for message in request.messages
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    }
    asked = [
        note
        for message in request.messages
        if message["role"] == "user"
        for note in NOTE.findall(msgspec.json.encode(message["content"]).decode())
    ]
    calls = [
        {
            "type": "tool_use",
            "id": f"note_{key}",
            "name": "note",
            "input": {"key": key, "a": int(a), "b": int(b)},
        }
        for key, a, b in dict.fromkeys(asked)
        if f"note_{key}" not in called
    ]
    if not calls:
        return ScriptedModel.text("noted")
    return ModelResponse(content=calls, stop_reason="tool_use")


@registry.entity(
    "agent",
    description="an agent run with a scripted model and a tool that writes state",
    state={"notes": Collection(primary_key="key", row=Note)},
)
async def agent(ctx: HandlerContext) -> None:
    notes = ctx.db.collection("notes", Note)

    async def note(call_id: str, p: NoteArgs, signal: Any, on_update: Any) -> ToolResult:
        on_update({"noting": p.key})
        _count(notes, p.key, Note(p.key, str(p.a + p.b), 1))
        return ToolResult(str(p.a + p.b))

    tool = AgentTool("note", "Notes a key and adds two numbers.", NoteArgs, note)
    ctx.use_agent(system_prompt="You take notes.", model=ScriptedModel(_respond), tools=[tool])
    await ctx.agent.run()
