"""When the timer loop must look next: the earliest due time of each owned partition.

An idle worker used to poll every partition's timers and schedules four times a
second (about 250 commands a second with 16 partitions). Instead the timer loop
keeps, for each partition it owns, the earliest due time of its timers and of its
schedules, and sleeps until the earliest of all, or until it learns of an earlier
one. It learns of them:

* when a partition is acquired (the loop reads the new partitions' first members);
* from the store's hints (``ScriptRunner.due_hints``): every commit that adds a timer
  and every schedule upsert of this worker's store tells it (timers are only ever
  added by the commits of the partition's owner, so no timer escapes it);
* from a slow safety-net read over every owned partition (``timer_poll_ms``, one
  command on one Redis node), for what no hint reports: a schedule a client wrote,
  a commit whose reply was lost, an operator's write.

A due time kept here may be early (the timer was cancelled, or fired by a previous
owner): the pass at that time finds nothing and reads the true next one. It is
never later than the truth for long: a read's answer cannot override a hint that
came while the read was in flight (:meth:`DueTimes.reading`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

TIMER, SCHEDULE = "timer", "schedule"


class DueTimes:
    """Per owned partition: the earliest timer (wall clock ms) and schedule (the
    schedule clock's ms) known, ``None`` for none. :attr:`changed` is set when an
    earlier one is learned or a partition is adopted."""

    def __init__(self) -> None:
        self._due: dict[int, dict[str, int | None]] = {}
        self._in_flight: list[dict[tuple[str, int], int]] = []  # hints since each read began
        self.changed = asyncio.Event()

    def known(self) -> set[int]:
        return set(self._due)

    def hint(self, kind: str, partition: int, due_ms: int) -> None:
        """A timer or schedule occurrence of ``partition`` is due at ``due_ms``."""
        for seen in self._in_flight:
            seen[(kind, partition)] = min(due_ms, seen.get((kind, partition), due_ms))
        entry = self._due.get(partition)
        if entry is None:
            return  # not (yet) read: the read on adoption finds it
        current = entry[kind]
        if current is None or due_ms < current:
            entry[kind] = due_ms
            self.changed.set()

    def keep_only(self, partitions: Iterable[int]) -> None:
        """Forget the partitions not in ``partitions`` (lost or handed over)."""
        keep = set(partitions)
        for p in list(self._due):
            if p not in keep:
                del self._due[p]

    def reading(self) -> dict[tuple[str, int], int]:
        """Start a read of due times: the hints that come until :meth:`apply` are kept
        aside, so that the read's (older) answer does not undo them."""
        seen: dict[tuple[str, int], int] = {}
        self._in_flight.append(seen)
        return seen

    def apply(
        self,
        seen: dict[tuple[str, int], int],
        read: dict[int, tuple[int | None, int | None]],
    ) -> None:
        """Take the answer of the read begun with ``seen`` (see :meth:`reading`)."""
        self._in_flight.remove(seen)
        for p, (timer, schedule) in read.items():
            self._due[p] = {
                TIMER: _earliest(timer, seen.get((TIMER, p))),
                SCHEDULE: _earliest(schedule, seen.get((SCHEDULE, p))),
            }

    def abandon(self, seen: dict[tuple[str, int], int]) -> None:
        """A read that failed: stop keeping its hints aside."""
        self._in_flight.remove(seen)

    def due(self, kind: str, now_ms: int) -> list[int]:
        """The partitions with a ``kind`` due at ``now_ms``."""
        return [p for p, e in self._due.items() if e[kind] is not None and e[kind] <= now_ms]  # type: ignore[operator]

    def earliest(self, kind: str, among: set[int]) -> int | None:
        """The earliest ``kind`` due time of the partitions ``among``."""
        dues = [e[kind] for p, e in self._due.items() if p in among and e[kind] is not None]
        return min(dues) if dues else None  # type: ignore[type-var]


def _earliest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
