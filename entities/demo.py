"""``wakeful demo``: a durable entity, an agent, and a worker killed with ``kill -9`` mid-run.

The demo serves the embedded Redis (a fakeredis) on a local TCP port from its
own process and runs its workers as real ``wakeful worker`` subprocesses on it
(:mod:`~wakeful.entities.demo_processes`), so it needs no Redis server. It kills
the first worker while the agent waits for a model step, after a tool call was
committed; a second worker takes the partition over once the dead one's lease
lapses (a short lease, with a countdown) and resumes the run from its journal
(:mod:`~wakeful.entities.demo_crash`). The model calls each process made are
recorded in Redis (:mod:`~wakeful.entities.demo_worker`), which shows that the
new worker asked the model only for the steps that were not journaled. It ends
with commands to try next (:mod:`~wakeful.entities.demo_next`).

The agent uses Claude when ``ANTHROPIC_API_KEY`` is set and a scripted stand-in
otherwise, so the demo always runs offline.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from wakeful import Runtime, Settings, WakefulError
from wakeful.embedded import SharedEmbedded
from wakeful.entities import registry
from wakeful.events import (
    Created,
    LogRecord,
    Message,
    RunFinished,
    StateChanged,
)

from .demo_crash import AGENT_URL, crash, start_worker, timeout
from .demo_next import print_next_steps
from .demo_processes import WorkerProcess, WorkerProcesses
from .demo_transcript import count, journal, print_journal, say, wrapped

# A short lease: a dead worker's partitions are free again after 2 s (its heartbeat,
# which keeps the partitions assigned to it, lapses after twice that).
SETTINGS = Settings(
    prefix="demo", partitions=4, lease_ttl_ms=2000, snapshot_every=4, shutdown_grace_s=10
)
NOTES_URL = "/notes/groceries"
AGENT_QUESTIONS = [
    "What is my favourite colour?",
    "Please research how many minutes sunlight takes to reach Earth. The Sun is "
    "149597870.7 km away and light travels 299792.458 km/s: 149597870.7 / 299792.458 / 60.",
]


async def run_demo() -> None:
    say("Wakeful demo: a durable 'notes' entity, then an agent that remembers and delegates,")
    say("with a worker process killed (kill -9) in the middle of an agent run.")
    say("No Redis server and no API key needed.")
    say()
    with SharedEmbedded() as server:
        settings = dataclasses.replace(SETTINGS, redis_url=server.url)
        async with (
            Runtime(registry, settings=settings, run_worker=False) as rt,
            WorkerProcesses(rt) as workers,
        ):
            say(f"0. The embedded Redis (a fakeredis) listens on {server.address}, served by this")
            say("   process so that worker processes can share it; it goes when the demo ends.")
            say("   This process is only a client: it sends and reads. The workers run apart.")
            a = await start_worker(workers, "A", stall=AGENT_URL)
            await _notes(rt, a, ["add buy milk", "add call the plumber", "add water the plants"])
            b = await crash(rt, workers, a)
            await _more_agent(rt)
            await _notes_after_the_crash(rt, b)
            say()
            say(f"5. Stop worker B gracefully (SIGTERM, pid {b.pid}): it finishes its wakes and")
            say("   hands its leases back, so a next worker would not wait for them.")
            code = await b.stop(settings.shutdown_grace_s + 5)
            say(f"   Worker B exited with code {code}. The embedded Redis goes with the demo.")
    print_next_steps()


# -- the notes entity ------------------------------------------------------------------


async def _notes(rt: Runtime, a: WorkerProcess, commands: list[str]) -> None:
    say()
    say(f"1. Send commands to {NOTES_URL} (a to-do list; no model).")
    await _send_all(rt, [*commands, "done 1"])
    status = await rt.wait_idle(NOTES_URL)
    say(f"   Worker {a.name} woke the entity; its status is now {status.status!r}.")
    _print_notes(await rt.state(NOTES_URL))


async def _send_all(rt: Runtime, commands: list[str]) -> None:
    for command in commands:
        event_id = await rt.send(NOTES_URL, command)
        say(f"   send {command!r:<26} -> event {event_id}")


def _print_notes(state: dict[str, list[Any]]) -> None:
    notes = state["notes"]
    say(f"   The entity's 'notes' collection now holds {len(notes)} notes:")
    for note in sorted(notes, key=lambda n: n["id"]):
        mark = "x" if note["done"] else " "
        say(f"     [{mark}] {note['id']}. {note['text']}")


async def _notes_after_the_crash(rt: Runtime, b: WorkerProcess) -> None:
    say()
    say(f"4. Back to {NOTES_URL}. Worker B never saw it: it rebuilds the state from the")
    say("   snapshot and the log that worker A left.")
    await _send_all(rt, ["done 3", "add book flights", "clear", "fly to the moon"])
    status = await rt.wait_idle(NOTES_URL)
    say(f"   Worker {b.name} woke the entity; its status is now {status.status!r}.")
    state: dict[str, list[Any]] = await rt.state(NOTES_URL)
    _print_notes(state)
    if state["rejected"]:
        say("   Rejected commands (kept as data, not errors):")
        for row in state["rejected"]:
            say(f"     {row['text']!r}: {row['reason']}")
    say()
    say("   The entity log is the source of truth. Every input and every committed write:")
    async for record in rt.events(NOTES_URL):
        if not isinstance(record, LogRecord):  # an undecodable entry: say so, go on
            say(f"   {record.id:<18} (unreadable)")
            continue
        event = record.event
        if isinstance(event, Created):
            what = f"created (type {event.type})"
        elif isinstance(event, Message):
            what = f"message {event.payload!r}"
        elif isinstance(event, StateChanged):
            what = "state: " + ", ".join(f"{op.op} {op.collection}[{op.key!r}]" for op in event.ops)
        else:
            what = type(event).__name__
        say(f"   {record.id:<18} {what}")
    snap = await rt.store.snapshot(NOTES_URL) if rt.store else None
    every = rt.settings.snapshot_every
    say()
    say(
        "   A snapshot of the state was written"
        if snap
        else f"   No snapshot yet (one is written every {every} log entries)"
    )


# -- the agent after the crash ----------------------------------------------------------


async def _more_agent(rt: Runtime) -> None:
    say()
    say("   Worker B goes on with the conversation (the memory survived the crash), and")
    say("   delegates research to a child agent.")
    shown = len(await journal(rt, AGENT_URL))
    for question in AGENT_QUESTIONS:
        say()
        try:
            answer = await rt.ask(AGENT_URL, question, timeout=timeout())
        except WakefulError as exc:
            answer = None
            say(f"   rt.ask failed: {exc}")
        shown = await print_journal(rt, AGENT_URL, shown, indent="   ")
        if answer is not None:
            wrapped("   ", "rt.ask ->", repr(answer))
    state: dict[str, list[Any]] = await rt.state(AGENT_URL)
    say()
    say(f"   The assistant's 'kv' collection (its memory) holds {len(state['kv'])} row(s):")
    for row in state["kv"]:
        say(f"     {row['key']} = {row['value']}")
    finished = [e for e in await journal(rt, AGENT_URL) if isinstance(e, RunFinished)]
    say(f"   {AGENT_URL} finished {count(len(finished), 'run')}.")
