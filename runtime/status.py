"""Entity status, derived from the metadata hash."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .events import unpack
from .streamids import ZERO, id_gt


@dataclass(frozen=True)
class EntityStatus:
    """Where an entity stands.

    ``status`` is ``failed`` (parked), ``pending`` (inputs not yet handled),
    ``waiting`` (its own inputs are handled, but effects are undelivered, timers
    are pending, or children whose runs it awaits are still running) or ``idle``.
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

    @property
    def idle(self) -> bool:
        return self.status == "idle"


def _text(meta: dict[str, bytes], field: str) -> str:
    return (meta.get(field) or b"").decode()


def status_from_meta(url: str, meta: dict[str, bytes]) -> EntityStatus:
    cursor = _text(meta, "cursor") or ZERO
    last_input = _text(meta, "last_in") or ZERO
    out_last = _text(meta, "out_last") or ZERO
    out_done = _text(meta, "out_done") or ZERO
    awaited = int(meta.get("waiting") or 0)
    timers = int(meta.get("timers") or 0)
    undelivered = id_gt(out_last, out_done)
    if meta.get("status") == b"failed":
        status = "failed"
    elif id_gt(last_input, cursor):
        status = "pending"
    elif undelivered or awaited or timers:
        status = "waiting"
    else:
        status = "idle"
    return EntityStatus(
        url=url,
        type=_text(meta, "type"),
        status=status,
        cursor=cursor,
        last_input=last_input,
        attempts=int(meta.get("attempts") or 0),
        error=_text(meta, "error") or None,
        parent=_text(meta, "parent") or None,
        args=unpack(meta["args"]) if meta.get("args") else None,
        created_id=_text(meta, "created"),
        awaited_children=awaited,
        timers=timers,
        undelivered=undelivered,
        pending_actions=int(meta.get("actions") or 0),
    )


@dataclass(frozen=True)
class Schedule:
    """A pending durable timer: ``payload`` is sent to ``target`` at ``due_ms`` (epoch ms)."""

    id: str
    target: str
    payload: Any
    due_ms: int
