"""Which tool call buffered a write, an event or an effect.

Tool calls of one model step run concurrently, and each one's result is
committed on its own. What a call buffers (collection writes, effects) must be
committed with *its* result, not with another call's: if the worker dies after
one result is committed, the other call is in doubt and may run again, and
its first writes must not be durable already. So every buffered item carries
the tool call it was made in (``None`` outside tool calls), and a commit takes
the items of the wake itself plus those of the call being committed.

Tools that run concurrently should not write the same row: each commit writes
the row as its own call left it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TypeVar

CURRENT_TOOL_CALL: ContextVar[str | None] = ContextVar("wakeful_tool_call", default=None)

ALL = "\x00all"  # take everything (the final commit of a wake)

T = TypeVar("T")


def take(buffer: list[tuple[str | None, T]], scope: str | None) -> list[T]:
    """Remove and return the items of the wake and of ``scope`` (all items for ``ALL``)."""
    if not buffer:
        return []
    if scope == ALL:
        everything = [item for _, item in buffer]
        buffer.clear()
        return everything
    taken: list[T] = []
    kept: list[tuple[str | None, T]] = []
    for owner, item in buffer:
        if owner is None or owner == scope:
            taken.append(item)
        else:
            kept.append((owner, item))
    buffer[:] = kept
    return taken
