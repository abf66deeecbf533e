"""The Redis key layout.

Every key of one partition carries the hash tag ``{<prefix>:pN}`` (written ``{T}``
below), so a Lua script can touch an entity's log, its metadata and its partition's
inbox atomically, on one Redis or on a Redis Cluster. The prefix is inside the tag:
partition N of two keyspaces hashes to two slots, so keyspaces spread over a cluster's
masters independently (a tag of ``{pN}`` alone put partition N of every keyspace in
one slot). Every key helper takes its tag from :meth:`Keyspace.tag` (or
:meth:`Keyspace.url_tag`), made in one place. Every key still starts with
``<prefix>:`` (ACL key patterns, scans). An entity lives in partition
``crc32(url) % partitions``.

The layout is versioned (:data:`LAYOUT`, field ``layout`` of ``<prefix>:config``):
a keyspace written by a version with another layout is refused at start-up
(``Store.setup``) instead of being read half.

==========================================  =========================================
key                                         what
==========================================  =========================================
``<prefix>:{T}:log:<url>``                 entity log (stream), the source of truth
``<prefix>:{T}:meta:<url>``                entity metadata (hash)
``<prefix>:{T}:snap:<url>``                latest state snapshot (msgpack string)
``<prefix>:{T}:conv:<url>``                the conversation's sealed chunks the snapshot
                                           references: ``<gen>:<k>`` -> msgpack list of
                                           events (hash; written and dropped with it)
``<prefix>:{T}:actions:<url>``             pending actions: tool call id -> pending |
                                            settled (hash)
``<prefix>:{T}:live:<url>``                live output: text deltas, tool progress
                                            (capped stream)
``<prefix>:{T}:idem:<url>:<key>``          idempotency key -> event id (string, TTL):
                                            of callers without an identity, and of
                                            entities' deliveries (``<url>|<key>`` for
                                            a key with a ':', see Keyspace.idem)
``<prefix>:{T}:idem@<digest>:<url>:<key>``  the same, of the caller whose identity's
                                            digest is ``<digest>`` (keys of two
                                            identities never meet)
``<prefix>:{T}:inbox``                     wake pointers of the partition (stream +
                                            consumer group ``workers``)
``<prefix>:{T}:lease`` / ``:epoch``        partition lease ``<worker>:<epoch>`` (TTL)
                                            and its fencing epoch counter
``<prefix>:{T}:type:<type>``               urls of one type in the partition (set)
``<prefix>:{T}:timers`` / ``:timerdata``   durable timers: member -> due time (sorted
                                            set) and member -> outbox event (hash)
``<prefix>:{T}:cron:<url>``                recurring schedules of the entity: schedule
                                            id -> spec (hash, msgpack ``CronSpec``)
``<prefix>:{T}:crondue``                   recurring schedules of the partition:
                                            ``<url>|<id>`` -> next occurrence ms
                                            (sorted set)
``<prefix>:{T}:trimdue``                   entities whose logs the retention sweep
                                           may trim: url -> when next (sorted set, ms)
``<prefix>:{T}:bad``                       wake pointers and timers the worker could
                                            not use, moved here with why (stream)
``<prefix>:workers``                        live workers (sorted set, score = expiry)
``<prefix>:config``                         keyspace settings (partition count, key
                                            layout version)
``<prefix>:types``                          manifests published by workers (hash)
``<prefix>:{T}:idle:<url>``                shard channel: the entity's commits changed
                                            its progress (waiters re-check its status)
``<prefix>:{T}:cancel``                     shard channel of the partition: cancel the
                                            running run of ``<url>`` (message
                                            ``<url>\n<reason>``)
``<prefix>:{T}:inbox``                     (also a shard channel: the inbox's doorbell
                                            on a Redis Cluster, ``doorbell.py``)
==========================================  =========================================
"""

from __future__ import annotations

import hashlib
import json
import zlib

from .errors import ConfigError, InvalidIdempotencyKeyError

GROUP = "workers"
"""The consumer group of every partition inbox."""

LAYOUT = "2"
"""The key layout version, kept in ``<prefix>:config`` (field ``layout``). 1 (no field):
tags ``{pN}`` without the prefix; 2: tags ``{<prefix>:pN}``."""


def identity_text(identity: dict[str, str]) -> str:
    """An identity as the text stored in metadata (``owner``) and digested into keys:
    compact JSON with sorted keys, so one identity always gives the same text."""
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


MAX_IDEMPOTENCY_KEY = 256
"""The longest idempotency key a caller may give, in characters: it becomes part of a
Redis key name, kept for ``idempotency_ttl_s`` (a UUID or a hash needs far less)."""


def check_idempotency_key(key: object) -> None:
    """Refuse a caller's idempotency key that is not text or is too long, before
    anything is written (an empty key is no key)."""
    if key is None:
        return
    if not isinstance(key, str):
        raise InvalidIdempotencyKeyError(
            f"field 'idempotency_key': the idempotency key must be text, not {type(key).__name__}"
        )
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidIdempotencyKeyError(
            f"the idempotency key has {len(key)} characters; at most {MAX_IDEMPOTENCY_KEY} are kept"
        )


def _digest(identity: dict[str, str]) -> str:
    return hashlib.sha256(identity_text(identity).encode()).hexdigest()[:32]


def owner_mark(owner: dict[str, str] | None, *, exists: bool) -> str:
    """Who owns an entity, as the SEND script compares it (``expect``): ``!`` no such
    entity, ``~`` one without an owner, ``=<identity text>`` one owned by it."""
    if not exists:
        return "!"
    return "~" if owner is None else "=" + identity_text(owner)


class Keyspace:
    """Every key and channel name of one keyspace (``prefix``, ``partitions``)."""

    def __init__(self, prefix: str = "wk", partitions: int = 16) -> None:
        if "{" in prefix or "}" in prefix:
            # A brace would end or start a hash tag early: keys of one partition could
            # land in different cluster slots.
            raise ConfigError(f"prefix {prefix!r} must not contain '{{' or '}}'")
        self.prefix = prefix
        self.partitions = partitions
        self.workers = f"{prefix}:workers"
        self.config = f"{prefix}:config"
        self.types = f"{prefix}:types"
        # Made once: a commit names ten keys, and a wake used to make each tag anew.
        self._tags = [self._make_tag(p) for p in range(partitions)]
        # The last url's tag: a commit names five keys of one entity in a row. One tuple,
        # so a thread of its own (the stall guard's) never reads one url's tag for another.
        self._last: tuple[str | None, str] = (None, "")

    def partition(self, url: str) -> int:
        return zlib.crc32(url.encode()) % self.partitions

    def _make_tag(self, partition: int) -> str:
        return f"{self.prefix}:{{{self.prefix}:p{partition}}}"

    def tag(self, partition: int) -> str:
        """The start of every key of ``partition``: ``<prefix>:{<prefix>:pN}``. The one
        place the hash tag is made (a Redis Cluster hashes only what is in braces)."""
        if 0 <= partition < self.partitions:
            return self._tags[partition]
        return self._make_tag(partition)

    def url_tag(self, url: str) -> str:
        """The tag of ``url``'s partition (the start of each of its keys)."""
        last = self._last
        if last[0] == url:
            return last[1]
        tag = self._tags[zlib.crc32(url.encode()) % self.partitions]
        self._last = (url, tag)
        return tag

    def slot_key(self, partition: int) -> str:
        """A key in ``partition``'s slot (for routing a command that names no key)."""
        return self.tag(partition)

    def log(self, url: str) -> str:
        return f"{self.url_tag(url)}:log:{url}"

    def meta(self, url: str) -> str:
        return f"{self.url_tag(url)}:meta:{url}"

    def live(self, url: str) -> str:
        return f"{self.url_tag(url)}:live:{url}"

    def actions(self, url: str) -> str:
        return f"{self.url_tag(url)}:actions:{url}"

    def cancel_channel(self, partition: int) -> str:
        """The partition's shard channel of cancel requests (``SPUBLISH``, message
        ``<url>\n<reason>``), in the partition's slot."""
        return f"{self.tag(partition)}:cancel"

    def snap(self, url: str) -> str:
        return f"{self.url_tag(url)}:snap:{url}"

    def conv(self, url: str) -> str:
        """The conversation chunks the entity's snapshot references (see state.Snapshot)."""
        return f"{self.url_tag(url)}:conv:{url}"

    def idem(self, url: str, key: str, identity: dict[str, str] | None = None) -> str:
        """Where an idempotency key is kept: per caller identity, so that one caller
        using another's key neither finds the other's event nor drops its own.

        ``<url>:<key>`` splits back into one url and one key only when the key has no
        ':' (an entity id may have them): /t/k with ``x:y`` and /t/k:x with ``y`` were
        one key, and the second send was dropped as the first's duplicate. A key with
        a ':' is kept as ``<url>|<key>`` (a url never has a '|'); the others keep the
        layout they had, so a retry across an upgrade is still deduplicated."""
        scope = "idem" if identity is None else f"idem@{_digest(identity)}"
        separator = "|" if ":" in key else ":"
        return f"{self.url_tag(url)}:{scope}:{url}{separator}{key}"

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
        return f"{self.url_tag(url)}:cron:{url}"

    def crondue(self, partition: int) -> str:
        return f"{self.tag(partition)}:crondue"

    def trimdue(self, partition: int) -> str:
        return f"{self.tag(partition)}:trimdue"

    def bad(self, partition: int) -> str:
        return f"{self.tag(partition)}:bad"

    def idle_channel(self, url: str) -> str:
        """The entity's shard channel of idle notices, in its partition's slot (the
        commit script publishes there, so the channel must hash like its keys)."""
        return f"{self.url_tag(url)}:idle:{url}"

    def channels_rule(self) -> str:
        """The ACL channel rule that grants every channel of the keyspace."""
        return f"&{self.prefix}:*"
