"""``wakeful demo``: the notes entity, then the assistant agent, on the embedded default.

The agent part uses Claude when ``ANTHROPIC_API_KEY`` is set and a scripted
stand-in otherwise, so the demo always runs offline.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import fakeredis

from wakeful.client import Runtime
from wakeful.config import Settings
from wakeful.embedded import embedded_redis
from wakeful.entities import registry
from wakeful.entities.assistant import pick_model
from wakeful.errors import WakefulError
from wakeful.events import (
    AssistantStep,
    Created,
    LogRecord,
    Message,
    RunFinished,
    StateChanged,
    ToolOutcome,
    UserTurn,
)


def _say(text: str = "") -> None:
    print(text, flush=True)


async def run_demo() -> None:
    server = fakeredis.FakeServer()  # the embedded Redis: in this process, kept until exit
    settings = Settings(prefix="demo", snapshot_every=4)
    url = "/notes/groceries"

    _say("Wakeful demo: a durable 'notes' entity, then an agent that remembers and delegates,")
    _say("on the embedded Redis (no server, no API key needed).")
    _say()
    _say(f"1. Start a runtime (client + worker in this process) and send commands to {url}.")
    async with Runtime(
        registry, settings=settings, redis=embedded_redis(server), run_worker=True
    ) as rt:
        assert rt.worker is not None
        first_worker = rt.worker.id
        for command in ["add buy milk", "add call the plumber", "add water the plants", "done 1"]:
            event_id = await rt.send(url, command)
            _say(f"   send {command!r:<26} -> event {event_id}")
        status = await rt.wait_idle(url)
        _say(f"   worker {first_worker} woke the entity; status is now {status.status!r}.")
        _print_notes(await rt.state(url))

    _say()
    _say("2. That worker is gone. Start a NEW worker on the same Redis and keep talking.")
    _say("   It has no memory of the entity: it rebuilds the state from the snapshot and log.")
    async with Runtime(
        registry, settings=settings, redis=embedded_redis(server), run_worker=True
    ) as rt:
        assert rt.worker is not None
        for command in ["done 3", "add book flights", "clear", "fly to the moon"]:
            event_id = await rt.send(url, command)
            _say(f"   send {command!r:<26} -> event {event_id}")
        status = await rt.wait_idle(url)
        _say(f"   worker {rt.worker.id} woke the entity; status is now {status.status!r}.")
        state: dict[str, list[Any]] = await rt.state(url)
        _print_notes(state)
        if state["rejected"]:
            _say("   Rejected commands (kept as data, not errors):")
            for row in state["rejected"]:
                _say(f"     {row['text']!r}: {row['reason']}")

        _say()
        _say("3. The entity log is the source of truth. Every input and every committed write:")
        async for record in rt.events(url):
            if not isinstance(record, LogRecord):  # an undecodable entry: say so, go on
                _say(f"   {record.id:<18} (unreadable)")
                continue
            event = record.event
            if isinstance(event, Created):
                what = f"created (type {event.type})"
            elif isinstance(event, Message):
                what = f"message {event.payload!r}"
            elif isinstance(event, StateChanged):
                what = "state: " + ", ".join(
                    f"{op.op} {op.collection}[{op.key!r}]" for op in event.ops
                )
            else:
                what = type(event).__name__
            _say(f"   {record.id:<18} {what}")
        snap = await rt.store.snapshot(url) if rt.store else None
        _say()
        _say(
            "   A snapshot of the state was written"
            if snap
            else f"   No snapshot yet (one is written every {settings.snapshot_every} log entries)"
        )
    _say()
    async with Runtime(
        registry, settings=settings, redis=embedded_redis(server), run_worker=True
    ) as rt:
        await _agent_demo(rt)
    _say()
    _say("Done. Next: run a worker on a real Redis with")
    _say("   wakeful worker wakeful.entities:registry --redis redis://127.0.0.1:6379/0")


def _print_notes(state: dict[str, list[Any]]) -> None:
    notes = state["notes"]
    _say(f"   The entity's 'notes' collection now holds {len(notes)} notes:")
    for note in sorted(notes, key=lambda n: n["id"]):
        mark = "x" if note["done"] else " "
        _say(f"     [{mark}] {note['id']}. {note['text']}")


# -- the agent part --------------------------------------------------------------------

AGENT_URL = "/assistant/demo"
AGENT_QUESTIONS = [
    "Remember that my favourite colour is teal.",
    "What is my favourite colour?",
    "Please research how many minutes sunlight takes to reach Earth. The Sun is "
    "149597870.7 km away and light travels 299792.458 km/s: 149597870.7 / 299792.458 / 60.",
]


async def _agent_demo(rt: Runtime) -> None:
    model = pick_model()
    if isinstance(model, str):
        which, timeout = f"Claude ({model}), because ANTHROPIC_API_KEY is set", 180.0
    else:
        which = "ScriptedModel (no ANTHROPIC_API_KEY: a scripted stand-in picks each step)"
        timeout = 30.0
    _say(f"4. An agent, {AGENT_URL}, with memory, a calculator and delegation.")
    _say(f"   Model: {which}.")
    _say("   Its conversation is journaled in its log; rt.ask waits for the run and for the")
    _say("   children it dispatched, and returns the response of the last run.")
    shown = 0
    for question in AGENT_QUESTIONS:
        _say()
        try:
            answer = await rt.ask(AGENT_URL, question, timeout=timeout)
        except WakefulError as exc:
            answer = None
            _say(f"   rt.ask failed: {exc}")
        shown = await _print_journal(rt, AGENT_URL, shown, indent="   ")
        if answer is not None:
            _wrapped("   ", "rt.ask ->", repr(answer))
    state: dict[str, list[Any]] = await rt.state(AGENT_URL)
    _say()
    _say(f"   The assistant's 'kv' collection (its memory) holds {len(state['kv'])} row(s):")
    for row in state["kv"]:
        _say(f"     {row['key']} = {row['value']}")


async def _journal(rt: Runtime, url: str) -> list[Any]:
    """The agent journal of ``url`` (and its finished runs), in log order."""
    kinds = (UserTurn, AssistantStep, ToolOutcome, RunFinished)
    return [
        r.event
        async for r in rt.events(url)
        if isinstance(r, LogRecord) and isinstance(r.event, kinds)
    ]


async def _print_journal(rt: Runtime, url: str, skip: int, indent: str) -> int:
    """Print the journal of ``url`` after its first ``skip`` entries; return how many there are.

    After a run that dispatched children, the children's runs are printed
    (indented) before the parent's next run, which is where they happened.
    """
    journal = await _journal(rt, url)
    me = url.split("/")[1] + ":"
    dispatched: list[str] = []
    for event in journal[skip:]:
        if isinstance(event, UserTurn):
            for block in event.content:
                text = block.get("text", "")
                if text.startswith("[message from"):
                    _wrapped(indent, "message:", text)
                else:
                    _wrapped(indent, "wake:" if text.startswith("[/") else "user:", text)
        elif isinstance(event, AssistantStep):
            for block in event.content:
                if block.get("type") == "text" and block["text"].strip():
                    _wrapped(indent, me, block["text"])
                elif block.get("type") == "tool_use":
                    _wrapped(indent, "  calls", f"{block['name']} {_brief(block.get('input'))}")
        elif isinstance(event, ToolOutcome):
            text = "".join(b.get("text", "") for b in event.content)
            _wrapped(indent, "  error" if event.is_error else "  result", text)
            spawned = event.name in ("spawn_agent", "dispatch")  # "dispatch" in older logs
            if spawned and isinstance(event.details, dict):
                dispatched.append(event.details["child"])
        elif isinstance(event, RunFinished):
            _say(
                f"{indent}(run finished: {event.status}, {_count(event.steps, 'model step')}, "
                f"{_count(event.tool_calls, 'tool call')})"
            )
            for child in dispatched:
                status = await rt.status(child)
                _say(f"{indent}| meanwhile {child} (type {status.type}, parent {status.parent}):")
                await _print_journal(rt, child, 0, indent + "|   ")
            dispatched = []
    return len(journal)


def _brief(arguments: Any, limit: int = 60) -> str:
    """Tool arguments as JSON, long strings cut (the full text is shown where it arrives)."""
    if isinstance(arguments, dict):
        arguments = {
            k: v[:limit] + "..." if isinstance(v, str) and len(v) > limit else v
            for k, v in arguments.items()
        }
    return json.dumps(arguments, ensure_ascii=False)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _wrapped(indent: str, label: str, text: str, width: int = 100) -> None:
    """``label`` then ``text``, wrapped, continuation lines aligned under the text."""
    first = f"{indent}{label:<12}"
    pad = indent + " " * 12
    out = []
    for n, line in enumerate(text.splitlines() or [""]):
        start = first if n == 0 else pad
        out.append(textwrap.fill(line, width, initial_indent=start, subsequent_indent=pad) or start)
    _say("\n".join(out))
