"""``memory``: a durable key/value notebook an agent keeps in its own collection.

The rows live in a collection of the entity (declare ``MEMORY_COLLECTION`` in
the type's ``state``), so they are part of the entity log like any other
state: a write made by a tool call commits together with that call's result,
survives restarts, and shows in ``rt.state(url)``. One tool with an ``action``
parameter keeps the model's tool list short.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from wakeful.agent_tools import AgentTool, ToolResult
from wakeful.cancellation import CancelSignal
from wakeful.schema import Collection

if TYPE_CHECKING:
    from wakeful.context import HandlerContext

__all__ = ["MEMORY_COLLECTION", "MemoryRequest", "Note", "memory_store"]

LIST_PREVIEW_CHARS = 200  # values longer than this are cut in a listing; "get" shows all


class Note(msgspec.Struct):
    """One remembered fact: ``value`` under ``key``."""

    key: str
    value: str


MEMORY_COLLECTION = Collection(primary_key="key", row=Note)


class MemoryRequest(msgspec.Struct):
    action: Annotated[
        Literal["get", "set", "delete", "list"],
        msgspec.Meta(
            description="get: read the value of key; set: store value under key (replacing "
            "it); delete: forget key; list: show every key and value"
        ),
    ]
    key: Annotated[
        str | None, msgspec.Meta(description="Short name of the fact; for get, set, delete")
    ] = None
    value: Annotated[str | None, msgspec.Meta(description="The fact to store; for set")] = None


def _problem(p: MemoryRequest) -> str | None:
    """What is wrong with this combination of arguments, if anything.

    Empty strings count as absent: models often fill optional fields with "".
    """
    key = (p.key or "").strip()
    if p.action == "set" and (not key or not p.value):
        return "set needs key and value"
    if p.action in ("get", "delete") and not key:
        return f"{p.action} needs key"
    if p.action != "set" and p.value:
        return f"{p.action} takes no value (only set does)"
    if p.action == "list" and key:
        return "list takes no key (it shows every key)"
    return None


def memory_store(
    ctx: HandlerContext, collection: str = "kv", *, approve_changes: bool = False
) -> AgentTool:
    """The ``memory`` tool over ``collection`` of the entity awake in ``ctx``.

    With ``approve_changes`` a call that would lose a remembered fact (``delete``
    of a key, or ``set`` replacing a different value) waits for a person's
    approval (``rt.approve`` / ``rt.deny``, the console's buttons, ``wakeful
    approve``) before it runs; the run is suspended meanwhile and resumes with
    the decision. Adding a new fact needs none.

    The collection must be declared with rows of :class:`Note` keyed by
    ``key`` (``MEMORY_COLLECTION``). A missing collection is a programming
    error, raised here (naming the declared ones) rather than at the model's
    first call.
    """
    rows = ctx.db.collections[collection]  # raises UnknownCollectionError naming the known ones
    actions = ctx.db.actions

    async def execute(
        call_id: str, p: MemoryRequest, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        problem = _problem(p)
        if problem is not None:
            return ToolResult(f"Invalid memory call: {problem}.", is_error=True)
        key = (p.key or "").strip()
        if p.action == "list":
            notes: list[Note] = rows.to_list()
            if not notes:
                return ToolResult("Memory is empty.", details={"keys": []})
            lines = [f"- {n.key}: {_preview(n.value)}" for n in notes]
            return ToolResult(
                f"{len(notes)} remembered:\n" + "\n".join(lines),
                details={"keys": [n.key for n in notes]},
            )
        current: Note | None = rows.get(key)
        if p.action == "get":
            if current is None:
                return ToolResult(f"Nothing is remembered under {key!r}.", details={"found": False})
            return ToolResult(
                f"{key}: {current.value}", details={"found": True, "value": current.value}
            )
        if p.action == "delete":
            if current is None:
                return ToolResult(f"Nothing was remembered under {key!r}; nothing to delete.")
            getattr(actions, f"{collection}_delete")(key=key)
            return ToolResult(f"Forgot {key!r}.", details={"deleted": key})
        value = p.value or ""
        if current is None:
            getattr(actions, f"{collection}_insert")(row=Note(key, value))
            return ToolResult(f"Remembered {key!r}.", details={"key": key, "replaced": None})

        def replace(note: Note) -> None:
            note.value = value

        getattr(actions, f"{collection}_update")(key=key, updater=replace)
        return ToolResult(
            f"Updated {key!r} (it was {_preview(current.value)!r}).",
            details={"key": key, "replaced": current.value},
        )

    async def loses_a_fact(call_id: str, p: MemoryRequest) -> bool:
        current: Note | None = rows.get((p.key or "").strip())
        if current is None or _problem(p) is not None:
            return False
        return p.action == "delete" or (p.action == "set" and p.value != current.value)

    return AgentTool(
        "memory",
        "Your long-term memory, kept across conversations and restarts: get, set, delete "
        "or list short facts by key. Check it before asking the user something they may "
        "have told you already.",
        MemoryRequest,
        execute,
        label="Memory",
        needs_approval=loses_a_fact if approve_changes else None,
    )


def _preview(value: str) -> str:
    if len(value) <= LIST_PREVIEW_CHARS:
        return value
    return value[:LIST_PREVIEW_CHARS] + f"... ({len(value)} characters)"
