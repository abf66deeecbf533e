"""The Redis key layout.

Every key of one partition carries the hash tag ``{pN}``, so a Lua script can
touch an entity's log, its metadata and its partition's inbox atomically, on one
Redis or on a Redis Cluster. An entity lives in partition
``crc32(url) % partitions``.

==========================================  =========================================
key                                         what
==========================================  =========================================
``<prefix>:{pN}:log:<url>``                 entity log (stream), the source of truth
``<prefix>:{pN}:meta:<url>``                entity metadata (hash)
``<prefix>:{pN}:snap:<url>``                latest state snapshot (msgpack string)
``<prefix>:{pN}:actions:<url>``             pending actions: tool call id -> pending |
                                            settled (hash)
``<prefix>:{pN}:live:<url>``                live output: text deltas, tool progress
                                            (capped stream)
``<prefix>:{pN}:idem:<url>:<key>``          idempotency key -> event id (string, TTL):
                                            of callers without an identity, and of
                                            entities' deliveries
``<prefix>:{pN}:idem@<digest>:<url>:<key>``  the same, of the caller whose identity's
                                            digest is ``<digest>`` (keys of two
                                            identities never meet)
``<prefix>:{pN}:inbox``                     wake pointers of the partition (stream +
                                            consumer group ``workers``)
``<prefix>:{pN}:lease`` / ``:epoch``        partition lease ``<worker>:<epoch>`` (TTL)
                                            and its fencing epoch counter
``<prefix>:{pN}:type:<type>``               urls of one type in the partition (set)
``<prefix>:{pN}:timers`` / ``:timerdata``   durable timers: member -> due time (sorted
                                            set) and member -> outbox event (hash)
``<prefix>:{pN}:cron:<url>``                recurring schedules of the entity: schedule
                                            id -> spec (hash, msgpack ``CronSpec``)
``<prefix>:{pN}:crondue``                   recurring schedules of the partition:
                                            ``<url>|<id>`` -> next occurrence ms
                                            (sorted set)
``<prefix>:{pN}:trimdue``                   entities whose logs the retention sweep
                                            may trim: url -> when next (sorted set, ms)
``<prefix>:{pN}:bad``                       wake pointers and timers the worker could
                                            not use, moved here with why (stream)
``<prefix>:workers``                        live workers (sorted set, score = expiry)
``<prefix>:config``                         keyspace settings (partition count)
``<prefix>:types``                          manifests published by workers (hash)
``<prefix>:idle:<url>``                     pub/sub: the entity's commits changed its
                                            progress (waiters re-check its status)
``<prefix>:cancel:<url>``                   pub/sub: cancel the entity's running run
==========================================  =========================================
"""

from __future__ import annotations

import hashlib
import json
import zlib

GROUP = "workers"
"""The consumer group of every partition inbox."""


def identity_text(identity: dict[str, str]) -> str:
    """An identity as the text stored in metadata (``owner``) and digested into keys:
    compact JSON with sorted keys, so one identity always gives the same text."""
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def owner_mark(owner: dict[str, str] | None, *, exists: bool) -> str:
    """Who owns an entity, as the SEND script compares it (``expect``): ``!`` no such
    entity, ``~`` one without an owner, ``=<identity text>`` one owned by it."""
    if not exists:
        return "!"
    return "~" if owner is None else "=" + identity_text(owner)


class Keyspace:
    """Every key and channel name of one keyspace (``prefix``, ``partitions``)."""

    def __init__(self, prefix: str = "wk", partitions: int = 16) -> None:
        self.prefix = prefix
        self.partitions = partitions
        self.workers = f"{prefix}:workers"
        self.config = f"{prefix}:config"
        self.types = f"{prefix}:types"

    def partition(self, url: str) -> int:
        return zlib.crc32(url.encode()) % self.partitions

    def tag(self, partition: int) -> str:
        return f"{self.prefix}:{{p{partition}}}"

    def log(self, url: str) -> str:
        return f"{self.tag(self.partition(url))}:log:{url}"

    def meta(self, url: str) -> str:
        return f"{self.tag(self.partition(url))}:meta:{url}"

    def live(self, url: str) -> str:
        return f"{self.tag(self.partition(url))}:live:{url}"

    def actions(self, url: str) -> str:
        return f"{self.tag(self.partition(url))}:actions:{url}"

    def cancel_channel(self, url: str) -> str:
        return f"{self.prefix}:cancel:{url}"

    def snap(self, url: str) -> str:
        return f"{self.tag(self.partition(url))}:snap:{url}"

    def idem(self, url: str, key: str, identity: dict[str, str] | None = None) -> str:
        """Where an idempotency key is kept: per caller identity, so that one caller
        using another's key neither finds the other's event nor drops its own."""
        if identity is None:
            return f"{self.tag(self.partition(url))}:idem:{url}:{key}"
        digest = hashlib.sha256(identity_text(identity).encode()).hexdigest()[:32]
        return f"{self.tag(self.partition(url))}:idem@{digest}:{url}:{key}"

    def inbox(self, partition: int) -> str:
        return f"{self.tag(partition)}:inbox"

    def lease(self, partition: int) -> str:
        return f"{self.tag(partition)}:lease"

    def epoch(self, partition: int) -> str:
        return f"{self.tag(partition)}:epoch"

    def typeset(self, partition: int, type_name: str) -> str:
        return f"{self.tag(partition)}:type:{type_name}"

    def timers(self, partition: int) -> str:
        return f"{self.tag(partition)}:timers"

    def timerdata(self, partition: int) -> str:
        return f"{self.tag(partition)}:timerdata"

    def crons(self, url: str) -> str:
        return f"{self.tag(self.partition(url))}:cron:{url}"

    def crondue(self, partition: int) -> str:
        return f"{self.tag(partition)}:crondue"

    def trimdue(self, partition: int) -> str:
        return f"{self.tag(partition)}:trimdue"

    def bad(self, partition: int) -> str:
        return f"{self.tag(partition)}:bad"

    def idle_channel(self, url: str) -> str:
        return f"{self.prefix}:idle:{url}"
