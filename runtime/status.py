"""Entity status: where an entity stands, derived from its parsed metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .events import unpack
from .replies import EntityMeta
from .streamids import id_gt

STATUSES = ("failed", "pending", "waiting", "suspended", "idle")


@dataclass(frozen=True)
class RunInfo:
    """A run of the entity: its id, ``status`` and when (epoch ms; ``at_ms`` is when
    the current run started, or when the last run finished; 0 if not recorded).

    A current run is ``running`` or ``suspended`` (waiting for pending actions); a
    finished one ``completed``, ``failed`` or ``cancelled`` (with its ``error``)."""

    id: str
    status: str
    at_ms: int = 0
    error: str | None = None


@dataclass(frozen=True)
class EntityStatus:
    """Where an entity stands, one word of :data:`STATUSES` everywhere (the client,
    the CLI, HTTP and the console).

    ``status`` is ``failed`` (parked), ``pending`` (inputs not yet handled),
    ``waiting`` (its own inputs are handled, but effects are undelivered, timers
    are pending, or children whose runs it awaits are still running),
    ``suspended`` (at rest, its open run waits for pending actions: a client's
    output or an approval) or ``idle``.

    ``run`` and ``last_run`` (the current and the last finished run) are read from
    the entity's state, so only ``rt.status(url, runs=True)``, ``wakeful inspect``
    and the HTTP status fill them in.
    """

    url: str
    type: str
    status: str
    cursor: str
    last_input: str
    attempts: int
    error: str | None
    parent: str | None
    args: Any
    created_id: str
    awaited_children: int = 0
    timers: int = 0
    undelivered: bool = False
    pending_actions: int = 0  # tool calls waiting for a client's output or an approval
    owner: dict[str, str] | None = None  # the identity that created it (None: none recorded)
    run: RunInfo | None = None
    last_run: RunInfo | None = None

    @property
    def idle(self) -> bool:
        return self.status == "idle"

    @property
    def at_rest(self) -> bool:
        """Nothing will happen without new input: idle, suspended or failed."""
        return self.status in ("idle", "suspended", "failed")


def entity_status(url: str, meta: EntityMeta) -> EntityStatus:
    """Where the entity with metadata ``meta`` stands.

    Metadata the runtime cannot read (a corrupted field) is reported, not raised: the
    status is ``failed`` and ``error`` names the fields (the worker parks such an
    entity at its next wake)."""
    awaited, timers, error = meta.awaited_children, meta.timers, meta.error
    try:
        # "partial" is not read on this path: check it with the fields that are.
        if (meta.corrupt or meta.partial) and (problems := meta.problems()):
            raise ValueError("; ".join(problems))
        undelivered = meta.undelivered
        if meta.parked:
            status = "failed"
        elif id_gt(meta.last_input, meta.cursor):
            status = "pending"
        elif undelivered or awaited or timers:
            status = "waiting"
        elif meta.pending_actions:
            status = "suspended"
        else:
            status = "idle"
        args = unpack(meta.args) if meta.args else None
    except ValueError as exc:  # msgspec's DecodeError is a ValueError too
        status, undelivered, args = "failed", False, None
        problems = meta.problems() or [f"its args cannot be decoded: {exc}"]
        if not (meta.parked and error and "corrupted metadata" in error):
            error = f"corrupted metadata: {'; '.join(problems)}" + (f" ({error})" if error else "")
    return EntityStatus(
        url=url,
        type=meta.type,
        status=status,
        cursor=meta.cursor,
        last_input=meta.last_input,
        attempts=meta.attempts,
        error=error,
        parent=meta.parent,
        args=args,
        created_id=meta.incarnation,
        awaited_children=awaited,
        timers=timers,
        undelivered=undelivered,
        pending_actions=meta.pending_actions,
        owner=meta.owner,
    )


@dataclass(frozen=True)
class Schedule:
    """A pending durable timer: ``payload`` is sent to ``target`` at ``due_ms`` (epoch ms)."""

    id: str
    target: str
    payload: Any
    due_ms: int
