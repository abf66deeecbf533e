"""The demo's crash: worker A killed with ``kill -9`` mid-run, worker B resuming the run.

Worker A stalls in the agent's first model call after a tool result (see
:mod:`wakeful.entities.demo_worker`); the demo kills it there, starts worker B,
counts down until the dead worker's lease lapses, waits for the run to finish
on B and tallies the model calls each process recorded.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from wakeful import Runtime, WakefulError
from wakeful.entities.assistant import pick_model
from wakeful.events import AssistantStep, ToolOutcome
from wakeful.leases import rendezvous_owner
from wakeful.store import Store

from .demo_processes import WorkerProcess, WorkerProcesses, until
from .demo_transcript import count, journal, paragraph, print_journal, say, wrapped
from .demo_worker import ModelCall, recorded_calls

AGENT_URL = "/assistant/demo"
CRASH_QUESTION = "Remember that my favourite colour is teal."


async def start_worker(
    workers: WorkerProcesses, name: str, stall: str | None = None
) -> WorkerProcess:
    """Start worker process ``name``, saying so before and after (it takes a moment)."""
    say(f"   Starting worker process {name} (wakeful worker wakeful.entities.demo_worker) ...")
    worker = await workers.start(name, stall=stall)
    say(f"   Worker {name} is up: pid {worker.pid}, worker id {worker.id}.")
    return worker


def timeout() -> float:
    """Seconds to wait for an answer: Claude may take a while, the stand-in does not."""
    return 180.0 if isinstance(pick_model(), str) else 60.0


async def crash(rt: Runtime, workers: WorkerProcesses, a: WorkerProcess) -> WorkerProcess:
    """Ask the agent on worker ``a``, kill ``a`` at its stall, resume on a new worker
    (returned); print the run and the model calls of each process."""
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
    ask = asyncio.create_task(rt.ask(AGENT_URL, CRASH_QUESTION, timeout=timeout() + 30))
    try:
        stalled: ModelCall | bool = await until(
            lambda: _stalled_call(rt, calls_before, ask), timeout(), "the agent's model step"
        )
        shown = await print_journal(rt, AGENT_URL, start, indent="   ")
        mid_run = isinstance(stalled, ModelCall)
        if isinstance(stalled, ModelCall):
            say(f"   ... worker {a.name} asks the model for the next step (model call {stalled.n}")
            say("   of its process) and, while it waits for the answer:")
        else:  # Claude may answer without a tool: then no step follows a tool result
            say("   (The model answered without calling a tool, so there is no step after a tool")
            say(f"   call to crash in: worker {a.name} is killed between runs instead.)")
        say()
        when = "mid-run" if mid_run else "between runs"
        say(f"3. kill -9 {a.pid}: worker {a.name} dies {when}. Nothing runs after SIGKILL: it")
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
        b = await start_worker(workers, "B")
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
