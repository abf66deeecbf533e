"""``notes``: a to-do list entity that keeps its state across wakes.

Messages are short commands::

    add <text>      add a note
    done <n>        mark note n as done
    drop <n>        delete note n
    clear           delete every finished note

Each note is a row of the ``notes`` collection; ``meta`` counts the commands
handled and keeps the next note number. Unknown commands are recorded in
``rejected`` instead of raising, because a bad message is the sender's
problem, not a reason to retry the wake.
"""

from __future__ import annotations

import msgspec

from wakeful import Collection, HandlerContext, Registry


class Note(msgspec.Struct):
    id: int
    text: str
    done: bool = False


class Counter(msgspec.Struct):
    key: str
    value: int


class Rejected(msgspec.Struct):
    key: str  # the message's event id
    text: str
    reason: str


STATE = {
    "notes": Collection(primary_key="id", row=Note),
    "meta": Collection(row=Counter),
    "rejected": Collection(row=Rejected),
}


def _bump(ctx: HandlerContext, key: str) -> int:
    """Increment counter ``key`` and return its new value."""
    meta = ctx.db.collection("meta", Counter)
    if key not in meta:
        meta.insert(Counter(key, 1))
        return 1

    def inc(row: Counter) -> None:
        row.value += 1

    return meta.update(key, inc).value


def _mark_done(note: Note) -> None:
    note.done = True


async def handle_notes(ctx: HandlerContext) -> None:
    # Typed handles on the collections: a checker knows their rows are Note, Rejected.
    notes = ctx.db.collection("notes", Note)
    rejected = ctx.db.collection("rejected", Rejected)
    for record in ctx.wake.events:
        message = record.event
        text = getattr(message, "payload", None)
        if not isinstance(text, str):
            continue
        verb, _, rest = text.strip().partition(" ")
        _bump(ctx, "commands")
        if verb == "add" and rest:
            notes.insert(Note(_bump(ctx, "next_id"), rest))
        elif verb in ("done", "drop") and rest.isdigit() and int(rest) in notes:
            if verb == "done":
                notes.update(int(rest), _mark_done)
            else:
                notes.delete(int(rest))
        elif verb == "clear":
            for note in notes.to_list():
                if note.done:
                    notes.delete(note.id)
        else:
            reason = "unknown note number" if verb in ("done", "drop") else "unknown command"
            rejected.insert(Rejected(record.id, text, reason))
            ctx.log.info("rejected %r: %s", text, reason)


def register(registry: Registry) -> None:
    registry.register(
        "notes",
        handle_notes,
        description="A to-do list: 'add <text>', 'done <n>', 'drop <n>', 'clear'",
        state=STATE,
    )


registry = Registry()
register(registry)
