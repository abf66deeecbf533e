"""``wakeful demo``: the notes entity on the embedded default, narrated."""

from __future__ import annotations

import fakeredis

from .client import Runtime
from .config import Settings
from .embedded import embedded_redis
from .events import Created, Message, StateChanged


def _say(text: str = "") -> None:
    print(text, flush=True)


async def run_demo() -> None:
    from entities import registry

    server = fakeredis.FakeServer()  # the embedded Redis: in this process, kept until exit
    settings = Settings(prefix="demo", snapshot_every=4)
    url = "/notes/groceries"

    _say("Wakeful demo: a durable 'notes' entity on the embedded Redis (no server, no API key).")
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
        state = await rt.state(url)
        _print_notes(state)
        if state["rejected"]:
            _say("   Rejected commands (kept as data, not errors):")
            for row in state["rejected"]:
                _say(f"     {row['text']!r}: {row['reason']}")

        _say()
        _say("3. The entity log is the source of truth. Every input and every committed write:")
        async for record in rt.events(url):
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
    _say("Done. Next: run a worker on a real Redis with")
    _say("   wakeful worker entities:registry --redis redis://127.0.0.1:6379/0")


def _print_notes(state: dict[str, list[dict[str, object]]]) -> None:
    notes = state["notes"]
    _say(f"   The entity's 'notes' collection now holds {len(notes)} notes:")
    for note in sorted(notes, key=lambda n: n["id"]):  # type: ignore[arg-type,return-value]
        mark = "x" if note["done"] else " "
        _say(f"     [{mark}] {note['id']}. {note['text']}")
