"""All Redis access of the runtime: the scripts and the few plain commands.

:class:`Store` is the only Redis speaker above the storage layer (its reads are in
``entity_reads.py``; scripts run through ``script_runner.py``; idle notices are
subscribed in ``notices.py``). The data path is: client ->
:meth:`Store.append_input` (SEND script) -> inbox -> worker
:meth:`Store.read_wake_pointers` -> :meth:`Store.load` (LOAD script) -> handler ->
:meth:`Store.commit` (COMMIT script). Replies are decoded in ``replies.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
from redis.asyncio import Redis
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoPermissionError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT

from .acl import Refusals, missing_right
from .connection import AUTHENTICATION_ERRORS
from .connection import block_ms as block_ms_for
from .doorbell import Doorbell
from .entity_reads import EntityReads, Loaded, StreamBatch
from .errors import (
    ArgsConflictError,
    ConfigError,
    EntityGoneError,
    FencedError,
    InvalidUrlError,
    NotSentError,
    OwnerChangedError,
    RedisFullError,
    ReplicaWaitError,
    TargetMissingError,
)
from .keys import GROUP, LAYOUT, Keyspace, identity_text
from .lease_store import LeaseStore
from .replies import EntityMeta, Entry, as_str, parse_meta, registry_text, stream_entries, text_keys
from .schedule_store import ScheduleStore
from .script_runner import (
    ACQUIRE,
    ALL_SCRIPTS,
    CANCEL_TIMER,
    CLAIM_OTHERS,
    COMMIT,
    DELETE,
    FIRE,
    HEARTBEAT,
    LOAD,
    QUARANTINE,
    RELEASE,
    RENEW,
    RESUME,
    SEND,
    SEND_AFTER,
    SEND_WAKE,
    SEND_WAKE_AFTER,
    SETTLE,
    TOOL_DATA,
    TRIM,
    WAKES,
    Script,
)
from .shard_channels import OneNode, ShardChannels
from .urls import parse_url

__all__ = [  # the scripts too, for tests that run them one by one
    "ACQUIRE",
    "ALL_SCRIPTS",
    "CANCEL_TIMER",
    "COMMIT",
    "DELETE",
    "FIRE",
    "HEARTBEAT",
    "LOAD",
    "QUARANTINE",
    "RELEASE",
    "RENEW",
    "RESUME",
    "SEND",
    "SEND_AFTER",
    "SEND_WAKE",
    "SEND_WAKE_AFTER",
    "SETTLE",
    "TOOL_DATA",
    "TRANSIENT_ERRORS",
    "TRIM",
    "WAKES",
    "BadItem",
    "EntityGoneError",
    "EntityMeta",
    "Entry",
    "Loaded",
    "Pointer",
    "Preloaded",
    "ReadAs",
    "Script",
    "SendCall",
    "SendResult",
    "Store",
    "StreamBatch",
    "TargetMissingError",
]

# The store's connections speak RESP2 and do not decode (decode_responses=False), so
# replies are lists and bytes; redis-py's annotations cover every protocol and mode,
# and the casts below narrow them to that shape.

log = logging.getLogger("wakeful.store")
LOADING_RETRY_S, LOADING_NOTICE_S = 0.1, 3.0  # waiting for a Redis that loads its data

# Errors that mean "Redis is unreachable for now" (a Redis loading its dataset, too), or
# full (at maxmemory, nothing written): callers retry later, nothing is lost. On a
# cluster also: a failover or a slot migration under way (CLUSTERDOWN, MASTERDOWN,
# TRYAGAIN, and MOVED / ASK left over after the redirections routing.py follows), a
# slot no node serves yet, and a write its replicas did not confirm in time.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    RedisFullError,
    ClusterDownError,  # MasterDownError too
    ClusterError,
    TryAgainError,
    AskError,  # MovedError too
    SlotNotCoveredError,
    ReplicaWaitError,
)
# What a worker waits out at its start (a Redis restarting, loading, not up yet).
WAIT_AT_START: tuple[type[BaseException], ...] = (BusyLoadingError, *TRANSIENT_ERRORS)
UNREACHABLE_RETRY_S = 0.5  # a worker waiting for a Redis that does not answer yet
REGISTRY_HORIZON_MS = 600_000  # no worker registers further ahead (see Store.heartbeat)


@dataclass(frozen=True, slots=True)
class SendResult:
    id: str  # the last event appended (or the one an idempotency key found)
    created_id: str  # the entity's incarnation
    appended: bool


@dataclass(slots=True)
class SendCall:
    """One send, ready to run (:meth:`Store.send_call`): alone (:meth:`Store.send`) or
    in the round trip of its sender's commit (:meth:`Store.commit`'s ``sends``), which
    sets ``reply`` (an exception if the send errored; None if it never ran)."""

    url: str
    partition: int
    script: Script
    keys: list[str]
    argv: list[Any]
    read_as: ReadAs | None
    reply: Any = None


@dataclass(slots=True)
class ChainedMark:
    """The delivery's mark at the end of a commit's chained sends (:meth:`Store.commit`'s
    ``mark``): a COMMIT, guarded by the chain's last link, that records the outbox the
    commit wrote as delivered and acknowledges ``acks``. ``done`` is set if it ran; if
    not (a send refused, errored or not run), the worker marks the outbox itself."""

    acks: Sequence[str]
    done: bool = False


@dataclass(slots=True)
class ReadAs:
    """A send made by a worker that holds the target's partition under ``token``: the
    SEND_WAKE script reads the partition's new wake pointers for ``consumer`` right
    after the send, with what their wakes load (like the WAKES read), so a pointer
    the send adds needs no inbox read and no load round trip of its own.

    Once the script's reply is in, ``replied`` is set and ``read`` holds what it read
    (nothing if the send was refused or the lease had moved), also when the send then
    raises (a refusal, or :class:`ReplicaWaitError`: applied, too few replicas). Without
    a reply (a lost connection) the script may or may not have read: those pointers,
    if any, are pending for ``consumer``."""

    token: str
    consumer: str
    count: int
    replied: bool = False
    read: list[Pointer | BadItem] = field(default_factory=list)

    def args(self) -> list[Any]:
        return [self.token, GROUP, self.consumer, self.count, PRELOAD_PAGE, PRELOAD_BUDGET]


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What a trim of an entity's log removed (or, dry, would remove)."""

    count: int  # entries removed (0 when dry)
    before: str  # entries before this id go ("" = none)
    last: str  # the last entry that goes ("" = none)
    next_due_ms: int | None = None  # when the sweep looks again (None = not filed)


# How many inbox reads a partition that had pointers is read with WAKES (read_inbox).
BUSY_READS = 8
# What the inbox read brings with each pointer (see Store.read_inbox): at most this many
# log entries per entity, and this many in all.
PRELOAD_PAGE, PRELOAD_BUDGET = 64, 4096


class Preloaded(msgspec.Struct, frozen=True):
    """What the inbox read brought with a pointer, read in the same script: the
    entity's metadata and its log after the cursor (complete unless ``truncated``),
    as of that read. ``loaded`` has no snapshot. (Like :class:`Pointer`, a struct: the
    read makes one per pointer, and a frozen dataclass takes several times as long.)"""

    loaded: Loaded
    truncated: bool


class Pointer(msgspec.Struct, frozen=True):
    """A wake pointer read from a partition inbox (with ``preload`` if the read
    brought the entity's metadata and log tail along)."""

    partition: int
    entry_id: str
    url: str
    preload: Preloaded | None = None


@dataclass(frozen=True, slots=True)
class BadItem:
    """A wake pointer or a timer member the worker cannot use, and why.

    The loops that meet one log it and move it to the partition's dead-letter
    stream (:meth:`Store.quarantine`, listed by :meth:`Store.bad_items`)."""

    partition: int
    kind: str  # "pointer" | "timer" | "sweep" (a member of the retention sweep set)
    key: str  # the inbox or the timer set it is in
    item: bytes  # the pointer's stream id, or the timer member
    reason: str
    detail: str = ""  # what a pointer held

    def describe(self) -> str:
        return f"bad {self.kind} {self.item!r} in {self.key}: {self.reason}"


def lost_group(exc: BaseException) -> bool:
    """Whether a read failed because the inbox or its consumer group is gone (a Redis
    that lost its data, or an inbox deleted): Redis says ``NOGROUP``, or ``UNBLOCKED``
    to a read blocked on the stream when it is deleted; fakeredis, for a stream that
    does not exist, says that the subcommand "requires the key to exist"."""
    text = str(exc)
    return any(sign in text for sign in ("NOGROUP", "UNBLOCKED", "requires the key to exist"))


def _pointer(
    keys: Keyspace, partition: int, entry_id: Any, fields: dict[bytes, bytes]
) -> Pointer | BadItem:
    """A pointer read from ``partition``'s inbox, or why it cannot be one."""
    url = fields.get(b"u")
    if url is None:
        reason = "it has no 'u' field (the entity url)"
    else:
        text, reason = url_of(keys, partition, url)
        if not reason:
            return Pointer(partition, as_str(entry_id), text)
        reason = f"its 'u' field: {reason}"
    detail = " ".join(f"{as_str(f)!r}={v!r}" for f, v in fields.items())
    item = entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()
    return BadItem(partition, "pointer", keys.inbox(partition), item, reason, detail)


def url_of(keys: Keyspace, partition: int, raw: bytes) -> tuple[str, str]:
    """The entity url ``raw`` (a pointer's 'u', a sweep member) names, and "", or "" and
    why it names no entity of ``partition``."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return "", f"{raw!r} is not UTF-8"
    try:
        parse_url(text)
    except InvalidUrlError as exc:
        return "", f"it is not an entity url: {exc}"
    owner = keys.partition(text)
    if owner != partition:
        return "", f"its url {text!r} belongs to partition {owner}"
    return text, ""


def _check_layout(prefix: str, layout: str) -> None:
    """Refuse a keyspace whose keys are laid out otherwise than this version's."""
    if layout == LAYOUT:
        return
    old = "tags {pN} without the prefix" if layout == "1" else f"layout {layout!r}"
    raise ConfigError(
        f"keyspace {prefix!r} was written with another key layout ({old}) than this "
        f"version of Wakeful reads (layout {LAYOUT}: tags {{{prefix}:pN}}, so that "
        "partitions spread over a cluster's masters); its data cannot be read in place. "
        "Start on a new keyspace (set WAKEFUL_PREFIX to a new prefix), or run the "
        "Wakeful version that wrote it, `wakeful export` what you need, and delete the "
        f"old keys ({prefix}:*)"
    )


def _timer(keys: Keyspace, partition: int, member: bytes) -> tuple[int, str] | BadItem:
    """A due timer member of ``partition`` (``<url>|<incarnation>|<id>``), or why not."""
    reason = ""
    try:
        text = member.decode()
    except UnicodeDecodeError:
        reason = "it is not UTF-8"
    else:
        url, _, rest = text.partition("|")
        created, _, timer_id = rest.partition("|")
        if not (url and created and timer_id):
            reason = "it is not '<url>|<incarnation>|<id>'"
        elif keys.partition(url) != partition:
            reason = f"its url {url!r} belongs to partition {keys.partition(url)}"
        else:
            return (partition, text)
    return BadItem(partition, "timer", keys.timers(partition), member, reason)


class Store(EntityReads, ScheduleStore, LeaseStore):
    """The runtime's one Redis speaker: scripts for every atomic change, plain reads.

    The reads of entity data are in :class:`~wakeful.entity_reads.EntityReads`, the
    recurring schedules in :class:`~wakeful.schedule_store.ScheduleStore`.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keyspace,
        *,
        idempotency_ttl_ms: int,
        replica_wait: int = 0,
        replica_wait_ms: int = 1000,
    ) -> None:
        super().__init__(redis, keys, replica_wait=replica_wait, replica_wait_ms=replica_wait_ms)
        self.idempotency_ttl_ms = idempotency_ttl_ms
        self._refused_notices = Refusals(log)
        self._refused_cancels = Refusals(log, logging.WARNING)
        self._read_failures = Refusals(log, logging.WARNING)
        # The links of a commit's chain of sends (Store.commit): unique to this process.
        self._chain_prefix = secrets.token_hex(4)
        self._chains = itertools.count()
        # The partitions an inbox read found pointers in lately, with how many reads
        # more they count as busy (None: every one, as at start): the next read tries
        # them with WAKES first (read_inbox).
        self._busy: dict[int, int] | None = None
        # The process's shard-channel subscriptions: the doorbell (on a cluster), the
        # worker's cancel requests, a client's idle notices (shard_channels.py).
        nodes = self.router if self.router is not None else OneNode(redis)
        self.channels = ShardChannels(nodes, keys.channels_rule())
        self._doorbell = Doorbell(self.channels, keys) if self.router is not None else None

    # -- setup ---------------------------------------------------------------

    async def _until_loaded(self, wait_for_redis: bool) -> None:
        """Load the scripts, retrying while Redis answers ``LOADING`` (and, with
        ``wait_for_redis``, while it cannot be reached); a warning says so at once and
        every :data:`LOADING_NOTICE_S` seconds."""
        since = time.monotonic()
        said: float | None = None
        while True:
            try:
                await self.load_scripts()
                if said is not None:
                    log.warning("Redis answers; going on")
                return
            except WAIT_AT_START as exc:
                # Refused credentials are a ConnectionError to redis-py, but no wait fixes
                # them: say so now instead of "cannot reach Redis" forever.
                if isinstance(exc, AUTHENTICATION_ERRORS) or not (
                    wait_for_redis or isinstance(exc, BusyLoadingError)
                ):
                    raise
                waited = time.monotonic() - since
                if said is None or waited - said >= LOADING_NOTICE_S:
                    said = waited
                    why = (
                        "Redis is loading its dataset into memory"
                        if isinstance(exc, BusyLoadingError)
                        else f"cannot reach Redis ({exc})"
                    )
                    log.warning("%s; waiting (%.0f s so far)", why, waited)
                loading = isinstance(exc, BusyLoadingError)
                await asyncio.sleep(LOADING_RETRY_S if loading else UNREACHABLE_RETRY_S)

    async def setup(self, *, wait_for_redis: bool = False) -> None:
        """Load the scripts and check the partition count against the keyspace. While
        Redis is still loading its dataset (after a restart) wait, saying so; with
        ``wait_for_redis`` (a worker) also while Redis cannot be reached."""
        await self._until_loaded(wait_for_redis)
        # Read first: a client of a full Redis (at maxmemory) starts without a write.
        config = self.keys.config
        try:
            partitions, layout = await self.redis.hmget(config, ["partitions", "layout"])
        except MovedError as exc:  # a redis:// URL of one node of a cluster
            raise ConfigError(
                f"the Redis is a node of a Redis Cluster (it sent the keyspace's settings "
                f"to {exc.host}:{exc.port}): connect with a redis+cluster://host:port URL"
            ) from None
        if not partitions:  # a new keyspace: the first process to get here sets it up
            await self.redis.hsetnx(config, "layout", LAYOUT)
            await self.redis.hsetnx(config, "partitions", self.keys.partitions)
            partitions, layout = await self.redis.hmget(config, ["partitions", "layout"])
        _check_layout(self.keys.prefix, as_str(layout) if layout else "1")
        stored = int(partitions or 0)
        if stored != self.keys.partitions:
            raise ConfigError(
                f"keyspace {self.keys.prefix!r} was set up with {stored} partitions, "
                f"but this process is configured with {self.keys.partitions}; "
                "set WAKEFUL_PARTITIONS to match"
            )

    async def close_routes(self) -> None:
        await self.channels.aclose()
        await super().close_routes()

    async def eviction_policy(self) -> str | None:
        """Redis's ``maxmemory-policy``; None if it will not say (CONFIG is disabled or
        not allowed, as on many managed services, or the embedded fakeredis)."""
        try:
            reply = cast("dict[Any, Any]", await self.redis.config_get("maxmemory-policy"))
        except ResponseError:
            return None
        value = reply.get(b"maxmemory-policy", reply.get("maxmemory-policy"))
        return as_str(value) if value is not None else None

    # -- inputs --------------------------------------------------------------

    async def append_input(
        self,
        url: str,
        type_name: str,
        *,
        created: bytes,
        events: Sequence[tuple[str, bytes]] = (),
        args: bytes = b"",
        parent: str = "",
        mode: str = "send",
        idempotency_key: str | None = None,
        idempotency_identity: dict[str, str] | None = None,
        owner: dict[str, str] | None = None,
        expect_owner: str = "",
        read_as: ReadAs | None = None,
    ) -> SendResult:
        """Append events to an entity's log and a wake pointer to its inbox, atomically.

        ``events`` are ``(flag, encoded event)`` pairs, flag ``"i"`` for inputs.
        ``mode`` is ``send`` (create the entity if missing), ``create``
        (get-or-create with ``args``; raises :class:`ArgsConflictError`) or
        ``existing`` (raises :class:`TargetMissingError` if missing).
        ``idempotency_key`` is kept per ``idempotency_identity`` (the caller's).
        ``owner`` is recorded if this creates the entity. ``expect_owner`` (see
        :func:`~wakeful.keys.owner_mark`; ``""`` = no check) must be the entity's owner now, or
        nothing is written and :class:`OwnerChangedError` is raised. ``read_as`` (a
        worker holding the target's partition, on one Redis): the partition's new wake
        pointers come back in it (:class:`ReadAs`).
        """
        call = self.send_call(
            url,
            type_name,
            created=created,
            events=events,
            args=args,
            parent=parent,
            mode=mode,
            idempotency_key=idempotency_key,
            idempotency_identity=idempotency_identity,
            owner=owner,
            expect_owner=expect_owner,
            read_as=read_as,
        )
        return await self.send(call)

    def send_call(
        self,
        url: str,
        type_name: str,
        *,
        created: bytes,
        events: Sequence[tuple[str, bytes]] = (),
        args: bytes = b"",
        parent: str = "",
        mode: str = "send",
        idempotency_key: str | None = None,
        idempotency_identity: dict[str, str] | None = None,
        owner: dict[str, str] | None = None,
        expect_owner: str = "",
        read_as: ReadAs | None = None,
    ) -> SendCall:
        """The script call of :meth:`append_input` (same arguments), not yet run."""
        k = self.keys
        p = k.partition(url)
        idem_key = k.idem(url, idempotency_key or "-", idempotency_identity)
        keys = [k.log(url), k.meta(url), k.inbox(p), idem_key, k.typeset(p, type_name)]
        script, extra = SEND, []
        if read_as is not None and self.router is None:  # a cluster's reader has a doorbell
            script, extra = SEND_WAKE, read_as.args()
            keys.append(k.lease(p))
        argv: list[Any] = [
            url,
            type_name,
            str(self.idempotency_ttl_ms) if idempotency_key else "",
            mode,
            args,
            created,
            parent,
            identity_text(owner) if owner is not None else "",
            expect_owner,
            len(events),
            *(x for pair in events for x in pair),
            *extra,
        ]
        return SendCall(url, p, script, keys, argv, read_as)

    async def send(self, call: SendCall) -> SendResult:
        """Run ``call`` on its own (see :meth:`append_input`)."""
        try:
            reply = await self._run(call.script, call.keys, call.argv, durable=True)
        except ReplicaWaitError as exc:  # applied: what it read is this worker's now
            if call.read_as is not None:
                self._read_for(call.read_as, call.partition, exc.reply)
            raise
        return self.send_result(call, reply)

    def send_result(self, call: SendCall, reply: Any) -> SendResult:
        """What ``call``'s script answered (``reply``), or the error it stands for."""
        url = call.url
        if call.read_as is not None:
            self._read_for(call.read_as, call.partition, reply)
        code, event_id, created_id = int(reply[0]), as_str(reply[1]), as_str(reply[2])
        if code == -1:
            raise ArgsConflictError(url)
        if code == -2:
            raise TargetMissingError(url)
        if code == -3:
            raise OwnerChangedError(url, event_id)
        if code == -4:
            raise NotSentError(url)
        return SendResult(event_id, created_id, code == 1)

    def _read_for(self, read_as: ReadAs, partition: int, reply: list[Any]) -> None:
        """What SEND_WAKE read, from its reply (a 4th element if it read)."""
        read_as.replied = True
        read_as.read = self._preloaded(partition, reply[3]) if len(reply) > 3 else []

    async def publish_cancel(self, url: str, reason: str) -> None:
        """Tell the worker running ``url`` (if any) to stop its run now, on the shard
        channel of its partition (``cancellation.CancelRequests``). A Redis user without
        the right to is logged, not raised: the cancel request is in the log."""
        channel = self.keys.cancel_channel(self.keys.partition(url))
        message = f"{url}\n{reason}"
        try:
            await self._in_slot(
                channel, lambda pipe: pipe.execute_command("SPUBLISH", channel, message)
            )
        except NoPermissionError:
            refused = missing_right(
                self.keys.channels_rule(), f"publish the cancel request of {url}"
            )
            self._refused_cancels.report(
                f"{refused}; the run is cancelled when a worker next reads its inputs"
            )

    async def resume(self, url: str, resumed: bytes, skipped: Sequence[str] = ()) -> bool:
        """Un-park a failed entity (RESUME script): active again, the cursor moved past
        ``skipped`` inputs, ``resumed`` (the encoded Resumed event) appended, and a wake
        pointer unless it has one. False if the entity is not failed."""
        k = self.keys
        reply = await self._run(
            RESUME,
            [k.meta(url), k.log(url), k.inbox(k.partition(url))],
            [url, resumed, *skipped],
        )
        return int(reply) == 1

    # -- commits -------------------------------------------------------------

    async def commit(
        self,
        url: str,
        token: str,
        *,
        events: Sequence[tuple[str, bytes]] = (),
        cursor: str = "",
        acks: Sequence[str] = (),
        fields: dict[str, Any] | None = None,
        created: str = "",
        snapshot: bytes = b"",
        snapshot_seen: str = "",
        snapshot_out: str = "",
        timers: Sequence[tuple[str, int, bytes]] = (),
        actions: Sequence[str] = (),
        closed_actions: Sequence[tuple[str, str]] = (),
        chunks: Sequence[tuple[str, bytes]] = (),
        drop_chunks: Sequence[str] = (),
        sends: Sequence[SendCall] = (),
        mark: ChainedMark | None = None,
        delivered: str = "",
    ) -> list[str]:
        """Fenced commit: append events, ack wake pointers, advance the cursor, add timers.

        ``events`` are ``(flag, encoded event)`` pairs: ``"e"`` plain, ``"i"``
        input, ``"o"`` outbox. A snapshot holds every event up to
        ``snapshot_seen`` (the last entry the wake read) and every output up to
        the last output this commit appends (or ``snapshot_out`` if it appends
        none); see ``state.fold``. With a snapshot, ``chunks`` (field, bytes) are the
        conversation chunks it seals and ``drop_chunks`` those it no longer references,
        written in the same script (see ``state.Snapshot``). Raises
        :class:`FencedError` if ``token`` no longer
        holds the partition lease, :class:`EntityGoneError` if the entity's
        incarnation changed.

        ``sends`` (the deliveries of the outbox this commit writes) go in the same round
        trip, right behind it, on one Redis without the replica wait; each runs only if
        the commit and the sends before it did (``lua.py``, SEND_AFTER), and its
        ``reply`` is set. Elsewhere they do not run here (``reply`` stays None).
        ``mark`` then goes last: the outbox recorded as delivered (and ``mark.acks``
        acknowledged) if every send ran and none was refused, and ``mark.done`` set.

        ``delivered`` (a delivery's mark) is the outbox now delivered: ``out_done``
        moves to it unless an outbox before it is not delivered yet (``lua.py``, COMMIT).
        """
        k = self.keys
        chained = bool(sends) and self.chains_sends
        link = f"{self._chain_prefix}{next(self._chains)}:" if chained else ""
        p = k.partition(url)
        args = self._commit_args(
            url,
            token,
            created,
            events=events,
            cursor=cursor,
            acks=acks,
            fields=fields or {},
            snapshot=snapshot,
            snapshot_seen=snapshot_seen,
            snapshot_out=snapshot_out,
            timers=timers,
            actions=actions,
            closed_actions=closed_actions,
            chunks=chunks,
            drop_chunks=drop_chunks,
            link=f"{link}0" if link else "",
            delivered=delivered,
        )
        keys = [
            k.lease(p),
            k.log(url),
            k.meta(url),
            k.inbox(p),
            k.snap(url),
            k.timers(p),
            k.timerdata(p),
            k.actions(url),
            k.conv(url),
            k.trimdue(p),
        ]
        if chained:
            marking: list[Any] | None = None
            if mark is not None:
                guard = f"{link}{len(sends)}"
                marking = self._commit_args(url, token, created, acks=mark.acks, guard=guard)
            reply = await self._commit_and_send(url, keys, args, sends, link, mark, marking)
        else:
            reply = await self._commit(url, keys, args)
        status = as_str(reply[0])
        if status == "FENCED":
            raise FencedError(f"commit for {url} refused: lease {token} of partition {p} is lost")
        if status == "GONE":
            raise EntityGoneError(url)
        if status == "UNNOTIFIED":
            self._notice_refused(url, "commit")
        if timers:  # the timer loop sleeps until the earliest timer it knows of
            self._hint_due("timer", p, min(due for _, due, _ in timers))
        return [as_str(i) for i in reply[1:]]

    @property
    def chains_sends(self) -> bool:
        """Whether :meth:`commit` runs its ``sends`` (one Redis, no replica wait): their
        scripts name the sender's metadata, a key of another slot, and a chain of
        scripts cannot wait for replicas between its links."""
        return self.router is None and not self.replica_wait

    def _commit_args(
        self,
        url: str,
        token: str,
        created: str,
        *,
        events: Sequence[tuple[str, bytes]] = (),
        cursor: str = "",
        acks: Sequence[str] = (),
        fields: dict[str, Any] | None = None,
        snapshot: bytes = b"",
        snapshot_seen: str = "",
        snapshot_out: str = "",
        timers: Sequence[tuple[str, int, bytes]] = (),
        actions: Sequence[str] = (),
        closed_actions: Sequence[tuple[str, str]] = (),
        chunks: Sequence[tuple[str, bytes]] = (),
        drop_chunks: Sequence[str] = (),
        link: str = "",
        guard: str = "",
        delivered: str = "",
    ) -> list[Any]:
        """The COMMIT script's arguments, in its order (see ``lua.py``)."""
        fields = fields or {}
        # Built by appending (a commit usually carries one or two of these lists).
        args: list[Any] = [
            token,
            GROUP,
            cursor,
            created,
            snapshot,
            snapshot_seen,
            snapshot_out,
            self.keys.idle_channel(url),
            url,
            len(events),
            len(acks),
            len(fields) * 2,
            len(timers),
            len(actions),
            len(closed_actions),
            link,
            guard,
            delivered,
        ]
        for event in events:
            args += event
        args += acks
        for item in fields.items():
            args += item
        for timer in timers:
            args += timer
        args += actions
        for closed in closed_actions:
            args += closed
        # the snapshot's conversation chunks (read only with a snapshot)
        args.append(len(drop_chunks))
        args += drop_chunks
        args.append(len(chunks))
        for chunk in chunks:
            args += chunk
        return args

    async def _commit_and_send(
        self,
        url: str,
        keys: list[str],
        args: list[Any],
        sends: Sequence[SendCall],
        link: str,
        mark: ChainedMark | None,
        marking: list[Any] | None,
    ) -> Any:
        """COMMIT and then ``sends``, chained (see :meth:`commit`), and then the mark
        (``marking``, its COMMIT's arguments) if any, in one round trip; the commit's
        reply. Each send's reply is set on it, and ``mark.done`` if the mark ran."""
        meta = keys[2]
        calls = [(COMMIT, keys, args)]
        for n, send in enumerate(sends):
            script = SEND_WAKE_AFTER if send.script is SEND_WAKE else SEND_AFTER
            chain = [f"{link}{n}", f"{link}{n + 1}"]
            calls.append((script, [*send.keys, meta], [*send.argv, *chain]))
        if marking is not None:
            calls.append((COMMIT, keys, marking))
        replies = await self._run_chain(calls)
        for send, reply in zip(sends, replies[1 : 1 + len(sends)], strict=True):
            send.reply = reply
        if mark is not None and marking is not None:
            # A send that answered an error may have run (its link left) and failed
            # after: the worker makes it again, and then marks with what it hears.
            sent = all(not isinstance(send.reply, Exception) for send in sends)
            mark.done = self._marked(url, replies[-1]) and sent
        return replies[0]

    def _marked(self, url: str, reply: Any) -> bool:
        """Whether the mark at a chain's end ran (an error, UNCHAINED, FENCED or GONE:
        it wrote nothing, and the worker marks the outbox itself)."""
        if isinstance(reply, Exception):
            return False
        status = as_str(reply[0])
        if status == "UNNOTIFIED":
            self._notice_refused(url, "delivery's mark")
        return status in ("OK", "UNNOTIFIED")

    async def _commit(self, url: str, keys: list[str], args: list[Any]) -> Any:
        """The COMMIT script, durable: with the replica wait on, it returns once the
        replicas confirmed it. A shortfall is logged, not raised: the commit is applied
        on the master, and a wake that failed on it would only run again."""
        try:
            return await self._run(COMMIT, keys, args, durable=True)
        except ReplicaWaitError as exc:
            log.warning("commit of %s: %s", url, exc)
            return exc.reply

    def _notice_refused(self, url: str, what: str) -> None:
        """A script applied its writes but Redis refused its idle notice (see ``notify``
        in lua.py): say what to grant; waiters still see the change when they re-check."""
        refused = missing_right(self.keys.channels_rule(), f"publish the idle notice of {url}")
        self._refused_notices.report(
            f"{refused}; the {what} is applied, and waiting clients see it when they next "
            "re-check (within a quarter second) instead of at once"
        )

    async def delete(self, url: str, token: str, created: str, acks: list[str]) -> bool:
        """Fenced: delete the entity's metadata, snapshot (and its conversation chunks),
        pending actions and live output, and empty its log (which expires; see the
        DELETE script)."""
        k = self.keys
        p = k.partition(url)
        type_name = url.split("/")[1]
        reply = await self._run(
            DELETE,
            [
                k.lease(p),
                k.log(url),
                k.meta(url),
                k.snap(url),
                k.typeset(p, type_name),
                k.inbox(p),
                k.actions(url),
                k.live(url),
                k.conv(url),
                k.trimdue(p),
            ],
            [token, created, url, GROUP, k.idle_channel(url), *acks],
        )
        if int(reply) == -1:
            raise FencedError(f"delete of {url} refused: lease {token} of partition {p} is lost")
        if int(reply) == 2:
            self._notice_refused(url, "deletion")
        return int(reply) in (1, 2)

    async def trim_log(
        self,
        url: str,
        token: str,
        *,
        retention_ms: int,
        keep: int,
        cap: str = "",
        dry: bool = False,
        retry_ms: int = 3_600_000,
    ) -> Trimmed:
        """Fenced: trim the entity's log of the entries its snapshot covers and no
        guarantee needs (the TRIM script says which). With ``dry`` only say which would
        go; ``cap`` keeps every entry at or after it (the exporter has those before).
        Unless dry, the entity is filed in its partition's sweep set for when more can
        go (``retry_ms`` from now while a parked entity or an undelivered outbox holds
        its log), or taken out of it."""
        k = self.keys
        p = k.partition(url)
        reply = await self._run(
            TRIM,
            [k.lease(p), k.log(url), k.meta(url), k.trimdue(p)],
            [token, retention_ms, keep, cap, "1" if dry else "0", url, retry_ms],
        )
        if int(reply[0]) == -1:
            raise FencedError(f"trim of {url} refused: lease {token} of partition {p} is lost")
        next_due = as_str(reply[3])
        return Trimmed(
            int(reply[0]), as_str(reply[1]), as_str(reply[2]), int(next_due) if next_due else None
        )

    async def trim_due(
        self, partitions: list[int], now_ms: int, limit: int
    ) -> list[tuple[int, list[bytes]]]:
        """The members of each partition's sweep set due at ``now_ms`` (at most ``limit``
        a partition), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.zrangebyscore(self.keys.trimdue(p), "-inf", now_ms, start=0, num=limit)
        replies = await pipe.execute()
        return list(zip(partitions, replies, strict=True))

    async def postpone_trim(self, partition: int, member: bytes, due_ms: int) -> None:
        """Look at ``member`` of the sweep set again at ``due_ms`` (if it is still there).
        Not fenced: the set only says when to try a trim, and every trim is fenced."""
        await self.redis.zadd(self.keys.trimdue(partition), {member: due_ms}, xx=True)

    # -- timers --------------------------------------------------------------

    async def due_timers(
        self, partitions: list[int], now_ms: int, limit: int = 100
    ) -> list[tuple[int, str] | BadItem]:
        """Due timers as ``(partition, member)``; a malformed member as a :class:`BadItem`."""
        replies = await self._per_partition(
            partitions,
            lambda pipe, p: pipe.zrangebyscore(
                self.keys.timers(p), "-inf", now_ms, start=0, num=limit
            ),
        )
        return [
            _timer(self.keys, p, m)
            for p, members in zip(partitions, replies, strict=True)
            for m in members
        ]

    async def next_timer_ms(self, partitions: list[int]) -> int | None:
        replies = await self._per_partition(
            partitions, lambda pipe, p: pipe.zrange(self.keys.timers(p), 0, 0, withscores=True)
        )
        dues = [int(score) for reply in replies for _, score in reply]
        return min(dues) if dues else None

    async def settle_action(self, url: str, tool_call_id: str, event: bytes) -> str | None:
        """Append the answer to a pending action, unless it was answered already.

        Returns the event id, or None if the action is not pending (unknown, or
        settled by a concurrent answer)."""
        k = self.keys
        p = k.partition(url)
        reply = await self._run(
            SETTLE,
            [k.actions(url), k.log(url), k.meta(url), k.inbox(p)],
            [tool_call_id, event, url],
        )
        return as_str(reply[1]) if int(reply[0]) == 1 else None

    async def append_tool_data(self, url: str, tool_call_id: str, event: bytes) -> str | None:
        """Append a client's tool data for a pending call (it does not wake the entity).

        Returns the event id, or None if the call's action is not pending."""
        k = self.keys
        reply = await self._run(TOOL_DATA, [k.actions(url), k.log(url)], [tool_call_id, event])
        return as_str(reply[1]) if int(reply[0]) == 1 else None

    async def action_state(self, url: str, tool_call_id: str) -> str:
        """``pending``, ``settled``, how the run that closed it ended (``cancelled``,
        ``failed``), or ``""`` for an unknown call."""
        value = await self.redis.hget(self.keys.actions(url), tool_call_id)
        return as_str(value) if value is not None else ""

    async def timers_of(self, url: str, created: str) -> list[tuple[str, int, bytes]]:
        """Pending timers of one incarnation of ``url``: (member, due ms, data)."""
        k = self.keys
        p = k.partition(url)
        # Urls and stream ids contain no glob characters (see urls.py).
        pattern = f"{url}|{created}|*"
        found: list[tuple[str, int]] = []
        async for member, score in self.redis.zscan_iter(k.timers(p), match=pattern, count=500):
            found.append((as_str(member), int(score)))
        if not found:
            return []
        data = cast(
            "list[bytes | None]", await self.redis.hmget(k.timerdata(p), [m for m, _ in found])
        )
        return sorted(
            ((m, due, d) for (m, due), d in zip(found, data, strict=True) if d is not None),
            key=lambda t: t[1],
        )

    async def cancel_timer(self, url: str, token: str, member: str) -> bool:
        """Fenced: remove a pending timer of ``url``; False if it fired or is gone."""
        k = self.keys
        p = k.partition(url)
        reply = int(
            await self._run(
                CANCEL_TIMER,
                [k.lease(p), k.timers(p), k.timerdata(p), k.meta(url)],
                [token, member],
            )
        )
        if reply == -1:
            raise FencedError(f"cancelling a timer of {url} refused: lease {token} is lost")
        return reply == 1

    async def fire_timer(self, partition: int, token: str, member: str) -> int:
        url, created, _ = member.split("|", 2)
        k = self.keys
        return int(
            await self._run(
                FIRE,
                [
                    k.lease(partition),
                    k.timers(partition),
                    k.timerdata(partition),
                    k.meta(url),
                    k.log(url),
                    k.inbox(partition),
                ],
                [token, member, url, created],
            )
        )

    # -- partitions: leases, inbox -------------------------------------------

    async def heartbeat(self, worker_id: str, ttl_ms: int | None) -> list[str]:
        """Register (or with ``ttl_ms=None`` deregister) ``worker_id``; the live workers.

        A member that expires more than :data:`REGISTRY_HORIZON_MS` (or ten heartbeat
        periods) ahead was not written by a worker: it is removed, with a warning."""
        horizon = max(REGISTRY_HORIZON_MS, 10 * (ttl_ms or 0))
        args = [worker_id, "" if ttl_ms is None else ttl_ms, horizon]
        live, dropped = await self._run(HEARTBEAT, [self.keys.workers], args)
        for member in dropped:
            log.warning(
                "removed %r from the worker registry %s: its expiry was more than %d s "
                "ahead, further than any worker sets (written by hand?)",
                registry_text(member),
                self.keys.workers,
                horizon // 1000,
            )
        return [registry_text(w) for w in live]

    async def acquire(self, partition: int, worker_id: str, ttl_ms: int) -> str | None:
        k = self.keys
        reply = await self._run(
            ACQUIRE, [k.lease(partition), k.epoch(partition)], [worker_id, ttl_ms]
        )
        return as_str(reply) if reply else None

    async def renew(self, partition: int, token: str, ttl_ms: int) -> bool:
        return bool(await self._run(RENEW, [self.keys.lease(partition)], [token, ttl_ms]))

    async def release(self, partition: int, token: str) -> bool:
        return bool(await self._run(RELEASE, [self.keys.lease(partition)], [token]))

    async def lease_owner(self, partition: int) -> str | None:
        value = await self.redis.get(self.keys.lease(partition))
        return registry_text(value) if value else None

    async def ensure_group(self, partition: int) -> None:
        key = self.keys.inbox(partition)
        try:
            await self._in_slot(
                key, lambda pipe: pipe.xgroup_create(key, GROUP, "0", mkstream=True)
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_inbox(
        self,
        partitions: list[int],
        consumer: str,
        count: int,
        block_ms: int,
        unsure: Callable[[int], None] = lambda partition: None,
    ) -> list[Pointer | BadItem]:
        """New wake pointers of ``partitions``, blocking up to ``block_ms`` for one.

        On one Redis the pointers of the partitions busy lately (``_note_busy``) come
        with their entities' metadata and log tails (the WAKES script: the read and the
        wakes' loads in one round trip), and those of the other partitions are read
        alongside with one plain XREADGROUP; only when neither finds any does it block,
        with a plain XREADGROUP of every partition. WAKES is a script call per
        partition: an idle worker only blocks (one command per block), and a lone
        message costs one WAKES call, not one for each partition held.

        A read that fails may still have been served (Redis read the pointers for
        ``consumer`` and the reply was lost): a failure of the whole read raises, and
        each partition whose read failed while the others' went through is passed to
        ``unsure``. Either way the caller must sweep those partitions' pending pointers
        later, or they stay pending for a live consumer that never saw them."""
        if self.router is not None:
            return await self._read_inboxes_by_node(partitions, consumer, count, block_ms, unsure)
        busy = [p for p in partitions if self._busy is None or p in self._busy]
        found = await self._read_busy(partitions, busy, consumer, count, unsure) if busy else []
        if not found:
            found = await self._read_plain(partitions, consumer, count, block_ms)
        self._note_busy(found)
        return found

    def _note_busy(self, found: list[Pointer | BadItem]) -> None:
        """A partition a read found pointers in counts as busy for the next
        ``BUSY_READS`` reads that find pointers: under a steady load most partitions
        stay busy and their pointers come with their entities' data, while after a lone
        message only its partition is read with WAKES. A read that found none (it
        blocked for nothing) leaves no partition busy: the worker is idle."""
        if not found:
            self._busy = {}
            return
        busy = {p: left - 1 for p, left in (self._busy or {}).items() if left > 1}
        for item in found:
            busy[item.partition] = BUSY_READS
        self._busy = busy

    async def _read_busy(
        self,
        partitions: list[int],
        busy: list[int],
        consumer: str,
        count: int,
        unsure: Callable[[int], None],
    ) -> list[Pointer | BadItem]:
        """WAKES for the ``busy`` partitions and, alongside, a plain read (no block) of
        the others: a pointer there waits for no lull of the busy ones."""
        rest = [p for p in partitions if p not in busy]
        if not rest:
            return await self._read_preloaded(busy, consumer, count, unsure)
        replies = await asyncio.gather(
            self._read_preloaded(busy, consumer, count, unsure),
            self._read_plain(rest, consumer, count, None),
            return_exceptions=True,
        )
        found: list[Pointer | BadItem] = []
        failed: list[BaseException] = []
        for read, reply in zip((busy, rest), replies, strict=True):
            if not isinstance(reply, BaseException):
                found += reply
                continue
            if not isinstance(reply, Exception) or failed:
                raise reply  # cancelled, or both reads failed
            failed.append(reply)
            if lost_group(reply):  # nothing was read: recreate the groups
                for partition in read:
                    await self.ensure_group(partition)
                continue
            for partition in read:  # served, perhaps, with its reply lost
                unsure(partition)
            self._read_failures.report(
                f"reading the inboxes of partitions {read} failed ({reply}); "
                "the other partitions are read on"
            )
        return found

    async def _read_plain(
        self, partitions: list[int], consumer: str, count: int, block_ms: int | None
    ) -> list[Pointer | BadItem]:
        """One XREADGROUP of ``partitions``: blocking up to ``block_ms`` if given (on a
        connection of its own), else through the auto-pipeline (in the same round trip
        as the WAKES read it goes alongside)."""
        streams: dict[KeyT, StreamIdT] = {self.keys.inbox(p): ">" for p in partitions}
        read: Awaitable[Any]
        if block_ms is None:
            read = self.batch.execute(lambda pipe: pipe.xreadgroup(GROUP, consumer, streams, count))
        else:
            block = block_ms_for(self.redis, block_ms)
            read = self.redis.xreadgroup(GROUP, consumer, streams, count=count, block=block)
        reply = cast("list[list[Any]] | None", await read)
        by_key = {self.keys.inbox(p): p for p in partitions}
        return [
            _pointer(self.keys, by_key[as_str(stream)], entry_id, fields)
            for stream, entries in (reply or [])
            for entry_id, fields in entries
            if fields
        ]

    async def _read_preloaded(
        self, partitions: list[int], consumer: str, count: int, unsure: Callable[[int], None]
    ) -> list[Pointer | BadItem]:
        """The WAKES script, one call per partition (a script touches one slot) in one
        round trip: the pointers there are now, each with its entity's metadata and log
        after the cursor (none for a pointer the script could not load)."""
        args = [GROUP, consumer, count, PRELOAD_PAGE, PRELOAD_BUDGET]
        replies = await asyncio.gather(
            *(self._run(WAKES, [self.keys.inbox(p)], args) for p in partitions),
            return_exceptions=True,
        )
        out: list[Pointer | BadItem] = []
        failed: list[tuple[int, BaseException]] = []
        for partition, reply in zip(partitions, replies, strict=True):
            if isinstance(reply, BaseException):
                failed.append((partition, reply))
            else:
                out.extend(self._preloaded(partition, reply))
        # The partitions whose script failed delivered nothing; the others' pointers are
        # delivered to this consumer now, so they are returned, never dropped for a
        # neighbour's error (which would leave them to the pending sweep).
        for partition, exc in failed:
            if not isinstance(exc, Exception):
                raise exc
            if lost_group(exc):
                await self.ensure_group(partition)
            elif len(failed) == len(partitions):
                raise exc
            else:
                unsure(partition)
                self._read_failures.report(
                    f"reading the inbox of partition {partition} failed ({exc}); "
                    "the other partitions are read on"
                )
        return out

    def _preloaded(self, partition: int, reply: list[Any]) -> list[Pointer | BadItem]:
        out: list[Pointer | BadItem] = []
        for entry_id, flat, loaded, meta_flat, raw in reply:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            if not fields:
                continue
            pointer = _pointer(self.keys, partition, entry_id, fields)
            if isinstance(pointer, Pointer) and int(loaded):
                meta = text_keys(meta_flat)
                entries = stream_entries(raw)
                preload = Preloaded(
                    Loaded(meta, parse_meta(meta), None, entries), len(entries) >= PRELOAD_PAGE
                )
                pointer = Pointer(partition, pointer.entry_id, pointer.url, preload)
            out.append(pointer)
        return out

    async def _read_inboxes_by_node(
        self,
        partitions: list[int],
        consumer: str,
        count: int,
        block_ms: int,
        unsure: Callable[[int], None],
    ) -> list[Pointer | BadItem]:
        """On a cluster: one XREADGROUP per partition (a read of several slots is
        CROSSSLOT even on one node), one pipeline per master, the masters in parallel.
        A node that fails costs only its partitions' pointers this round (logged, and
        the first error if every node failed); when no partition had a pointer, wait
        for the doorbell (``doorbell.py``), up to ``block_ms``, and read again."""
        assert self.router is not None and self._doorbell is not None
        deadline = time.monotonic() + max(block_ms, 1) / 1000
        while True:
            self._doorbell.clear()  # a ring from now on is kept for the wait below
            replies = await self.router.per_node(
                {p: self.keys.inbox(p) for p in partitions},
                lambda pipe, p: pipe.xreadgroup(GROUP, consumer, {self.keys.inbox(p): ">"}, count),
            )
            out: list[Pointer | BadItem] = []
            failed: list[tuple[int, Exception]] = []
            for p, reply in replies.items():
                if isinstance(reply, Exception):
                    failed.append((p, reply))
                    continue
                out.extend(
                    _pointer(self.keys, p, entry_id, fields)
                    for _, entries in (reply or [])
                    for entry_id, fields in entries
                    if fields
                )
            nogroup = [p for p, exc in failed if lost_group(exc)]
            for p in nogroup:
                await self.ensure_group(p)
            failed = [(p, exc) for p, exc in failed if p not in nogroup]
            if failed:
                if len(failed) == len(partitions):
                    raise failed[0][1]
                for p, _ in failed:
                    unsure(p)
                self._read_failures.report(
                    f"reading the inboxes of partitions {sorted(p for p, _ in failed)} failed "
                    f"({failed[0][1]}); the other partitions are read on"
                )
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            await self._doorbell.wait(partitions, left)

    async def claim_pending(
        self, partition: int, consumer: str, min_idle_ms: int, count: int = 1000
    ) -> list[Pointer | BadItem]:
        """Take over pointers read but never acked by anyone (a crashed or fenced owner)."""
        key = self.keys.inbox(partition)
        out: list[Pointer | BadItem] = []
        start = "0-0"
        while True:
            reply = await self._in_slot(
                key,
                lambda pipe, start=start: pipe.xautoclaim(  # type: ignore[misc]
                    key, GROUP, consumer, min_idle_ms, start_id=start, count=count
                ),
            )
            next_start, entries = as_str(reply[0]), reply[1]
            out.extend(
                _pointer(self.keys, partition, eid, fields) for eid, fields in entries if fields
            )
            if next_start == "0-0":
                return out
            start = next_start

    async def claim_others(self, partition: int, owner: str) -> list[Pointer | BadItem]:
        """Take over the pointers of ``partition``'s inbox pending for consumers other
        than ``owner`` (who holds its lease), whatever their idle time, and forget the
        consumers left with none (the CLAIM_OTHERS script)."""
        key = self.keys.inbox(partition)
        entries = await self._run(CLAIM_OTHERS, [key], [GROUP, owner, 1000])
        return [
            _pointer(self.keys, partition, eid, fields)
            for eid, fields in stream_entries(entries)
            if fields
        ]

    # -- the worker's plain commands (engine) ---------------------------------

    async def publish_types(self, manifests: dict[str, bytes]) -> None:
        """Record the manifests of the types a worker runs, for clients and other workers."""
        # redis-py types ``mapping`` as a Mapping with a union key type: invariant in the
        # key, so it refuses a dict[str, bytes] although any str key is accepted.
        await self.redis.hset(self.keys.types, mapping=manifests)  # type: ignore[arg-type]

    async def type_published(self, type_name: str) -> bool:
        """Whether some worker published ``type_name`` (its registry has the type)."""
        return bool(await self.redis.hexists(self.keys.types, type_name))

    async def read_wake_pointers(
        self,
        partitions: list[int],
        consumer: str,
        count: int,
        block_ms: int,
        unsure: Callable[[int], None] = lambda partition: None,
    ) -> list[Pointer | BadItem]:
        """:meth:`read_inbox`; if Redis lost a consumer group (a restart without
        persistence), recreate the groups and return no pointers (the caller reads again)."""
        try:
            return await self.read_inbox(partitions, consumer, count, block_ms, unsure)
        except ResponseError as exc:
            if not lost_group(exc):
                raise
        for p in partitions:
            await self.ensure_group(p)
        return []

    async def quarantine(self, bad: BadItem, token: str, worker_id: str) -> int:
        """Fenced: move ``bad`` out of its inbox or timer set into the partition's
        dead-letter stream. 1 moved, 0 gone already, -1 fenced."""
        k = self.keys
        p = bad.partition
        source = {"pointer": k.inbox(p), "sweep": k.trimdue(p)}.get(bad.kind, k.timers(p))
        return int(
            await self._run(
                QUARANTINE,
                [k.lease(p), k.bad(p), source, k.timerdata(p)],
                [token, bad.kind, bad.item, bad.reason, bad.detail, GROUP, worker_id],
            )
        )

    async def bad_items(self, count: int = 100) -> list[dict[str, str]]:
        """The newest entries of every partition's dead-letter stream (see
        :meth:`quarantine`): partition, id, kind, key, item, reason, detail, worker."""
        streams = await self._every_partition(
            lambda pipe, p: pipe.xrevrange(self.keys.bad(p), count=count)
        )
        out = []
        for p, raw in enumerate(streams):
            if isinstance(raw, Exception):
                raise raw
            for entry_id, fields in stream_entries(raw):
                row = {
                    f.decode(errors="backslashreplace"): v.decode(errors="backslashreplace")
                    for f, v in fields.items()
                }
                if "kind" not in row:  # not a quarantine's entry: listed as what it holds
                    row = {
                        "kind": "unknown",
                        "key": self.keys.bad(p),
                        "reason": "an entry Wakeful did not write",
                        "detail": " ".join(f"{f}={v}" for f, v in row.items()),
                    }
                out.append({"partition": str(p), "id": entry_id, **row})
        return out
