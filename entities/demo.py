"""``wakeful demo``: a durable entity, an agent, and a worker killed with ``kill -9`` mid-run.

The demo serves the embedded Redis (a fakeredis) on a local TCP port from its
own process and runs its workers as real ``wakeful worker`` subprocesses on it
(:mod:`wakeful.entities.demo_processes`), so it needs no Redis server. It kills
the first worker while the agent waits for a model step, after a tool call was
committed; a second worker takes the partition over once the dead one's lease
lapses (a short lease, with a countdown) and resumes the run from its journal.
The model calls each process made are recorded in Redis
(:mod:`wakeful.entities.demo_worker`), which shows that the new worker asked the
model only for the steps that were not journaled.

The agent uses Claude when ``ANTHROPIC_API_KEY`` is set and a scripted stand-in
otherwise, so the demo always runs offline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shlex
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from wakeful import Runtime, Settings, WakefulError
from wakeful.embedded import SharedEmbedded
from wakeful.entities import registry
from wakeful.entities.assistant import pick_model
from wakeful.events import (
    AssistantStep,
    Created,
    LogRecord,
    Message,
    RunFinished,
    StateChanged,
    ToolOutcome,
)
from wakeful.leases import rendezvous_owner
from wakeful.store import Store

from .demo_processes import WorkerProcess, WorkerProcesses, until
from .demo_transcript import count, journal, paragraph, print_journal, say, wrapped
from .demo_worker import ModelCall, recorded_calls

# A short lease: a dead worker's partitions are free again after 2 s (its heartbeat,
# which keeps the partitions assigned to it, lapses after twice that).
SETTINGS = Settings(
    prefix="demo", partitions=4, lease_ttl_ms=2000, snapshot_every=4, shutdown_grace_s=10
)
NOTES_URL = "/notes/groceries"
AGENT_URL = "/assistant/demo"
CRASH_QUESTION = "Remember that my favourite colour is teal."
AGENT_QUESTIONS = [
    "What is my favourite colour?",
    "Please research how many minutes sunlight takes to reach Earth. The Sun is "
    "149597870.7 km away and light travels 299792.458 km/s: 149597870.7 / 299792.458 / 60.",
]
REDIS_HINT = "redis://127.0.0.1:6379/0"


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
            a = await _start(workers, "A", stall=AGENT_URL)
            await _notes(rt, a, ["add buy milk", "add call the plumber", "add water the plants"])
            b = await _crash(rt, workers, a)
            await _more_agent(rt)
            await _notes_after_the_crash(rt, b)
            say()
            say(f"5. Stop worker B gracefully (SIGTERM, pid {b.pid}): it finishes its wakes and")
            say("   hands its leases back, so a next worker would not wait for them.")
            code = await b.stop(settings.shutdown_grace_s + 5)
            say(f"   Worker B exited with code {code}. The embedded Redis goes with the demo.")
    _next_steps()


async def _start(workers: WorkerProcesses, name: str, stall: str | None = None) -> WorkerProcess:
    say(f"   Starting worker process {name} (wakeful worker wakeful.entities.demo_worker) ...")
    worker = await workers.start(name, stall=stall)
    say(f"   Worker {name} is up: pid {worker.pid}, worker id {worker.id}.")
    return worker


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


# -- the agent, and the crash ----------------------------------------------------------


def _timeout() -> float:
    """Seconds to wait for an answer: Claude may take a while, the stand-in does not."""
    return 180.0 if isinstance(pick_model(), str) else 60.0


async def _crash(rt: Runtime, workers: WorkerProcesses, a: WorkerProcess) -> WorkerProcess:
    model = pick_model()
    if isinstance(model, str):
        which = f"Claude ({model}), because ANTHROPIC_API_KEY is set"
    else:
        which = "ScriptedModel (no ANTHROPIC_API_KEY: a scripted stand-in picks each step)"
    say()
    say(f"2. An agent, {AGENT_URL}, with memory, a calculator and delegation.")
    say(f"   Model: {which}.")
    say("   Each model step and each tool result is committed to the entity log before the")
    say("   next step starts: that journal is what a new worker resumes from.")
    say()
    store = _store(rt)
    calls_before = len(await recorded_calls(store.redis, rt.settings.prefix))
    start = len(await journal(rt, AGENT_URL))
    ask = asyncio.create_task(rt.ask(AGENT_URL, CRASH_QUESTION, timeout=_timeout() + 30))
    try:
        stalled: ModelCall | bool = await until(
            lambda: _stalled_call(rt, calls_before, ask), _timeout(), "the agent's model step"
        )
        shown = await print_journal(rt, AGENT_URL, start, indent="   ")
        if not isinstance(
            stalled, ModelCall
        ):  # Claude may answer without a tool: no step follows a tool result
            say("   (The model answered without calling a tool, so there is no step after a tool")
            say(f"   call to crash in: worker {a.name} is killed between runs instead.)")
        else:
            say(f"   ... worker {a.name} asks the model for the next step (model call {stalled.n}")
            say("   of its process) and, while it waits for the answer:")
        say()
        say(f"3. kill -9 {a.pid}: worker {a.name} dies mid-run. Nothing runs after SIGKILL: it")
        say("   hands back no lease and leaves its wake unacknowledged.")
        await a.kill()
        after = await journal(rt, AGENT_URL)  # what the log holds after the crash
        kept = after[start:]
        journaled = _steps(kept)
        results = sum(isinstance(e, ToolOutcome) for e in kept)
        say(
            f"   Journaled before the crash: {count(journaled, 'model step')} and "
            f"{count(results, 'tool result')}."
        )
        b = await _start(workers, "B")
        await _takeover(rt, a, b, AGENT_URL)
        answer = await ask
    finally:
        ask.cancel()
    await print_journal(rt, AGENT_URL, shown, indent="   ")
    wrapped("   ", "rt.ask ->", repr(answer))
    if isinstance(stalled, ModelCall):
        say("   (rt.ask waited since before the crash: a client does not see a worker die.)")
        calls = (await recorded_calls(store.redis, rt.settings.prefix))[calls_before:]
        steps = _steps((await journal(rt, AGENT_URL))[start:])
        _tally(a, b, calls, steps, (journaled, _steps(after)))
    return b


def _store(rt: Runtime) -> Store:
    if rt.store is None:
        raise WakefulError("the demo's runtime is not started")
    return rt.store


async def _stalled_call(rt: Runtime, skip: int, ask: asyncio.Task[str]) -> ModelCall | bool | None:
    """The call of the agent that stalls, after the ``skip`` recorded before; True if the
    run finished without one."""
    calls = (await recorded_calls(_store(rt).redis, rt.settings.prefix))[skip:]
    found = next((c for c in calls if c.stalled and c.url == AGENT_URL), None)
    if found is None and ask.done():
        ask.result()  # its error, if it failed
        return True
    return found


def _steps(events: list[Any]) -> int:
    """The model steps journaled in ``events``."""
    return sum(isinstance(e, AssistantStep) for e in events)


async def _takeover(rt: Runtime, dead: WorkerProcess, new: WorkerProcess, url: str) -> None:
    """Wait, counting down, until ``new`` holds the partition of ``url`` that ``dead`` held."""
    partition = _store(rt).keys.partition(url)
    say("   waiting for the dead worker's lease to lapse:", end="")
    shown: int | None = None

    async def taken() -> bool | None:
        nonlocal shown
        if not new.alive():
            raise WakefulError(f"worker {new.name} exited:\n{new.output()}")
        if await rt.partition_owner(partition) == new.id:
            return True
        left = math.ceil(await _lapses_in(rt, dead, partition))
        if left > 0 and left != shown:
            say(f" {left} s", end="")
            shown = left
        return None

    await until(taken, 60, f"worker {new.name} to take partition {partition} over")
    say(" - lapsed." if shown is not None else " it had lapsed while worker B started.")
    say(f"   Worker {new.name} holds partition {partition} of {url} now; it claims the wake")
    say(f"   worker {dead.name} left unacknowledged and resumes the run from the journal:")


async def _lapses_in(rt: Runtime, dead: WorkerProcess, partition: int) -> float:
    """Seconds until another worker may take ``partition``: the dead worker's lease
    expires, and while its heartbeat lasts the partition stays assigned to it if the
    hash says so. The lease and its TTL are read together: a lease the new worker
    took in between is not the dead one's."""
    store = _store(rt)
    key = store.keys.lease(partition)
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.get(key)
        pipe.pttl(key)
        holder, ttl = await pipe.execute()
    held = holder is not None and holder.decode().rsplit(":", 1)[0] == dead.id
    lease_ms = max(int(ttl), 0) if held else 0
    live = {w.id: w.expires_in_ms for w in await rt.workers()}
    heartbeat_ms = live.get(dead.id, 0)
    if heartbeat_ms and rendezvous_owner(partition, list(live)) == dead.id:
        return max(lease_ms, heartbeat_ms) / 1000
    return lease_ms / 1000


def _tally(
    a: WorkerProcess,
    b: WorkerProcess,
    calls: list[ModelCall],
    steps: int,
    journaled: tuple[int, int],
) -> None:
    """Say how many times each worker asked the model during the crashed run, and
    whether the new worker asked for a step the journal held: ``journaled`` is the
    model steps of the run journaled before the crash, and of the whole conversation."""
    in_run, in_conversation = journaled
    by_a = [c for c in calls if c.pid == a.pid and c.url == AGENT_URL]
    by_b = [c for c in calls if c.pid == b.pid and c.url == AGENT_URL]
    lost = sum(c.stalled for c in by_a)
    paragraph(
        f"The run took {count(steps, 'model step')}. Model calls: worker A (pid {a.pid}) made "
        f"{len(by_a)}, {lost} of them never answered (it was killed waiting); worker B "
        f"(pid {b.pid}) made {len(by_b)}."
    )
    asked_again = [c for c in by_b if c.prior < in_conversation]
    not_journaled = steps - in_run
    if asked_again:
        paragraph(
            f"model calls by the new worker: {len(by_b)}, {len(asked_again)} of them for a "
            "step journaled before the crash: a journaled step was asked again."
        )
    elif len(by_b) == not_journaled:
        say(f"   model calls by the new worker: {len(by_b)} = {steps} steps - {in_run} journaled")
        say("   before the crash: no journaled step was asked again.")
    else:  # a wake retried (a lease lost on a loaded machine) asks its open step again
        paragraph(
            f"model calls by the new worker: {len(by_b)}, each for one of the {not_journaled} "
            "steps not journaled before the crash (a wake retried before its commit asks "
            "for its step again): no journaled step was asked again."
        )


async def _more_agent(rt: Runtime) -> None:
    say()
    say("   Worker B goes on with the conversation (the memory survived the crash), and")
    say("   delegates research to a child agent.")
    shown = len(await journal(rt, AGENT_URL))
    for question in AGENT_QUESTIONS:
        say()
        try:
            answer = await rt.ask(AGENT_URL, question, timeout=_timeout())
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


# -- what next -------------------------------------------------------------------------


def wakeful_command() -> str:
    """``wakeful`` as the user's shell runs it: the script beside this Python (relative
    to the current directory when it is below it), or plain ``wakeful`` when that is
    the same script on PATH (an activated venv)."""
    here = Path(sys.executable).parent
    script = here / "wakeful"
    if not script.exists():
        return shlex.join([_shown_path(Path(sys.executable)), "-m", "wakeful.cli"])
    found = shutil.which("wakeful")
    if found is not None and Path(found).absolute() == script.absolute():
        return "wakeful"
    return _shown_path(script)


def _shown_path(path: Path) -> str:
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())


def next_steps() -> list[tuple[str, str]]:
    """What to try next: (command, what it does), each runnable as printed."""
    w = wakeful_command()
    app = "wakeful.entities:registry"
    redis = f"--redis {REDIS_HINT}"
    question = shlex.quote("Remember that my favourite colour is teal.")
    return [
        (
            f"{w} serve {app}",
            "the web console at http://127.0.0.1:8000/console/: chat with the assistant "
            "(a worker and the embedded Redis in one process; Ctrl-C stops it)",
        ),
        (
            f"{w} worker {app} {redis}",
            "with a Redis server at 127.0.0.1:6379: a worker (leave it running)",
        ),
        (
            f"{w} ask /assistant/me {question} {redis}",
            "then, in another terminal, talk to the agent",
        ),
        (f"{w} tail /assistant/me {redis}", "and read its log as a transcript"),
        (f"{w} --help", "every command"),
    ]


def _next_steps() -> None:
    say()
    say("What next? Each command runs as printed, from this directory:")
    for command, what in next_steps():
        say(textwrap.fill(what, 96, initial_indent="  # ", subsequent_indent="  # "))
        say(f"  $ {command}")
