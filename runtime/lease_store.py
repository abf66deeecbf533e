"""The worker's idle-time commands: what it sends Redis when nothing happens.

An idle worker renews its leases, heartbeats and looks for due timers. On one Redis
node each of these is one command for every partition it holds (a script over all
their keys), so its idle cost does not grow with the partition count; on a Redis
Cluster a script may not span slots, so each partition's command goes to its master,
pipelined per master (one round trip a master). See docs/design.md, "Partitions,
leases and fencing".
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .keys import GROUP
from .script_runner import FIRST_DUE, RENEW, RENEW_ALL, REQUEUE, ScriptRunner


@dataclass(frozen=True, slots=True)
class Renewal:
    """A lease renewal's answer (true when the lease was still held and is renewed),
    and, when the renewing worker asked, how many pointers of the partition's inbox
    are pending for it and for other consumers (see ``LeaseKeeper._reconcile``)."""

    held: bool
    own_pending: int = 0
    others_pending: int = 0

    def __bool__(self) -> bool:
        return self.held

    @classmethod
    def parse(cls, reply: Any) -> Renewal:
        """RENEW's or RENEW_ALL's answer for one lease: 1 or 0, or {held, own, others}."""
        if isinstance(reply, list):
            held, own, others = (int(x) for x in reply)
            return cls(bool(held), own, others)
        return cls(bool(int(reply)))


class LeaseStore(ScriptRunner):
    """Leases renewed, due times read and stray pointers put back, per partition each."""

    async def renew_all(
        self, leases: Sequence[tuple[int, str]], ttl_ms: int, consumer: str = ""
    ) -> list[Renewal | Exception]:
        """Renew each ``(partition, token)``: whether each one was still held, in order;
        with ``consumer`` (the renewing worker), also how many pointers of each renewed
        partition's inbox are pending for it and for other consumers.

        One script call on one node (an error fails them all: it is one server). On a
        cluster one RENEW per lease, sent concurrently (each goes to its master,
        through that master's auto-pipeline), each on its own: a lease whose master
        fails gets its exception in its place, and the others are renewed."""
        if not leases:
            return []
        k = self.keys
        if self.router is None:
            keys = [k.lease(p) for p, _ in leases]
            if consumer:
                keys += [k.inbox(p) for p, _ in leases]
            args = [ttl_ms, GROUP, consumer, *(t for _, t in leases)]
            reply = await self._run(RENEW_ALL, keys, args)
            return [Renewal.parse(r) for r in reply]

        async def renew(partition: int, token: str) -> Renewal:
            if not consumer:
                return Renewal.parse(await self._run(RENEW, [k.lease(partition)], [token, ttl_ms]))
            keys = [k.lease(partition), k.inbox(partition)]
            return Renewal.parse(await self._run(RENEW, keys, [token, ttl_ms, GROUP, consumer]))

        results = await asyncio.gather(*(renew(p, t) for p, t in leases), return_exceptions=True)
        out: list[Renewal | Exception] = []
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancelled
            out.append(result)
        return out

    async def first_due(
        self, partitions: Sequence[int]
    ) -> dict[int, tuple[int | None, int | None]]:
        """The earliest due time (ms) of each partition's timers and of its schedules,
        ``None`` where there is none. One script call on one node; on a cluster a
        ``ZRANGE`` of each set, pipelined per master (a partition whose master fails
        is left out of the answer, and is read again at the next pass)."""
        if not partitions:
            return {}
        k = self.keys
        if self.router is None:
            keys = [key for p in partitions for key in (k.timers(p), k.crondue(p))]
            reply = await self._run(FIRST_DUE, keys, [])
            scores = [_score(r) for r in reply]
            return {p: (scores[2 * i], scores[2 * i + 1]) for i, p in enumerate(partitions)}

        sets = {
            (p, which): (k.timers(p), k.crondue(p))[which] for p in partitions for which in (0, 1)
        }
        replies = await self.router.per_node(
            sets, lambda pipe, item: pipe.zrange(sets[item], 0, 0, withscores=True)
        )
        out: dict[int, tuple[int | None, int | None]] = {}
        for p in partitions:
            timers, crons = replies[(p, 0)], replies[(p, 1)]
            if isinstance(timers, Exception) or isinstance(crons, Exception):
                continue
            out[p] = (_first(timers), _first(crons))
        return out

    async def requeue(self, partition: int, consumer: str, ids: Sequence[str]) -> int:
        """Put back the pointers ``ids`` that ``consumer`` read of ``partition`` (which it
        does not hold): the owner reads them as new. Returns how many were put back."""
        if not ids:
            return 0
        key = self.keys.inbox(partition)
        return int(await self._run(REQUEUE, [key], [GROUP, consumer, *ids]))


def _score(value: object) -> int | None:
    """A score as whole ms: ``None`` for none or ``+inf`` (never due), ``-inf`` as 0."""
    if value in (b"", ""):
        return None
    score = float(value.decode() if isinstance(value, bytes) else str(value))
    if math.isinf(score):
        return None if score > 0 else 0
    return int(score)


def _first(reply: list[tuple[object, float]]) -> int | None:
    return _score(str(reply[0][1])) if reply else None
