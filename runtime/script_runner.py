"""Running the Lua scripts: each by its SHA1 through the auto-pipeline.

The scripts are loaded once at start-up (and again after a Redis restart lost
them), so a call sends only the SHA1, the keys and the arguments. On a Redis
Cluster they are loaded on every master, one command each (``routing.py`` sends
each script to its partition's master); a replica promoted after a failover never
got them, and its first ``NOSCRIPT`` loads them there.

With the replica wait on (``Settings.replica_wait``), a write that must survive a
failover (a send, a commit) is followed in the same pipeline, on the same
connection, by ``WAIT <replicas> <timeout>``: Redis answers it once that many
replicas have acknowledged every write the connection made before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import lua
from .batching import AutoPipeline, Commands, Stage
from .connection import is_cluster
from .errors import RedisFullError, ReplicaWaitError
from .keys import Keyspace
from .routing import Router


class Script:
    """A Lua script and its SHA1, to run it by ``EVALSHA``."""

    def __init__(self, source: str, name: str = "") -> None:
        self.source = source
        self.name = name
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        # On a cluster: the same script ringing the inbox's doorbell (see lua.py).
        self.cluster_source = source.replace(lua.DOORBELL_MARK, lua.DOORBELL)
        self.cluster_sha = hashlib.sha1(self.cluster_source.encode()).hexdigest()


SEND = Script(lua.SEND, "SEND")
SEND_WAKE = Script(lua.SEND_WAKE, "SEND_WAKE")
SEND_AFTER = Script(lua.SEND_AFTER, "SEND_AFTER")
SEND_WAKE_AFTER = Script(lua.SEND_WAKE_AFTER, "SEND_WAKE_AFTER")
LOAD = Script(lua.LOAD, "LOAD")
WAKES = Script(lua.WAKES, "WAKES")
COMMIT = Script(lua.COMMIT, "COMMIT")
ACQUIRE = Script(lua.ACQUIRE, "ACQUIRE")
RENEW = Script(lua.RENEW, "RENEW")
RELEASE = Script(lua.RELEASE, "RELEASE")
HEARTBEAT = Script(lua.HEARTBEAT, "HEARTBEAT")
RENEW_ALL = Script(lua.RENEW_ALL, "RENEW_ALL")
FIRST_DUE = Script(lua.FIRST_DUE, "FIRST_DUE")
REQUEUE = Script(lua.REQUEUE, "REQUEUE")
CLAIM_OTHERS = Script(lua.CLAIM_OTHERS, "CLAIM_OTHERS")
FIRE = Script(lua.FIRE, "FIRE")
DELETE = Script(lua.DELETE, "DELETE")
CANCEL_TIMER = Script(lua.CANCEL_TIMER, "CANCEL_TIMER")
SETTLE = Script(lua.SETTLE, "SETTLE")
TOOL_DATA = Script(lua.TOOL_DATA, "TOOL_DATA")
RESUME = Script(lua.RESUME, "RESUME")
QUARANTINE = Script(lua.QUARANTINE, "QUARANTINE")
CRON_UPSERT = Script(lua.CRON_UPSERT, "CRON_UPSERT")
CRON_DELETE = Script(lua.CRON_DELETE, "CRON_DELETE")
CRON_PURGE = Script(lua.CRON_PURGE, "CRON_PURGE")
CRON_FIRE = Script(lua.CRON_FIRE, "CRON_FIRE")
CRON_QUARANTINE = Script(lua.CRON_QUARANTINE, "CRON_QUARANTINE")
TRIM = Script(lua.TRIM, "TRIM")
ALL_SCRIPTS = (
    SEND,
    SEND_WAKE,
    SEND_AFTER,
    SEND_WAKE_AFTER,
    LOAD,
    WAKES,
    COMMIT,
    FIRE,
    DELETE,
    CANCEL_TIMER,
    SETTLE,
    TOOL_DATA,
    RESUME,
    QUARANTINE,
    TRIM,
    ACQUIRE,
    RENEW,
    RELEASE,
    HEARTBEAT,
    RENEW_ALL,
    FIRST_DUE,
    REQUEUE,
    CLAIM_OTHERS,
    CRON_UPSERT,
    CRON_DELETE,
    CRON_PURGE,
    CRON_FIRE,
    CRON_QUARANTINE,
)


class ScriptRunner:
    """The Redis client, the key layout and the script runner every store part shares."""

    def __init__(
        self,
        redis: Redis,
        keys: Keyspace,
        *,
        replica_wait: int = 0,
        replica_wait_ms: int = 1000,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.batch = AutoPipeline(redis)
        # On a cluster: scripts and per-partition reads go to their master directly.
        self.router = Router(redis) if is_cluster(redis) else None
        self.replica_wait = replica_wait
        self.replica_wait_ms = replica_wait_ms
        # Told of each timer ("timer") or schedule occurrence ("schedule") this store
        # writes, as (kind, partition, due ms): the worker's timer loop sleeps until the
        # earliest one it knows of (``due_times.py``) instead of polling Redis.
        self.due_hints: list[Callable[[str, int, int], None]] = []

    def _hint_due(self, kind: str, partition: int, due_ms: int) -> None:
        for hint in self.due_hints:
            hint(kind, partition, due_ms)

    async def load_scripts(self) -> None:
        if self.router is not None:
            for node in await self.router.masters():
                await self._load_on(node)
            return
        pipe = self.redis.pipeline(transaction=False)
        for script in ALL_SCRIPTS:
            pipe.script_load(script.source)
        await pipe.execute()

    async def _load_on(self, node: str) -> None:
        """Load every script on one cluster node (no pipeline: one command each)."""
        assert self.router is not None
        client = self.router.client(node)
        for script in ALL_SCRIPTS:
            await client.script_load(script.cluster_source)

    async def close_routes(self) -> None:
        """Close the per-node clients of a cluster (the cluster client is the caller's)."""
        if self.router is not None:
            await self.router.aclose()

    async def _run(
        self, script: Script, keys: list[str], args: list[Any], *, durable: bool = False
    ) -> Any:
        """Run a script through the auto-pipeline, reloading it after a Redis restart.

        A Redis at its ``maxmemory`` (``noeviction``) refuses the script's first write
        that could grow memory, before anything of it is written (the scripts carry no
        shebang flags, so Redis checks at each call, and once a script has written its
        later writes go through: no script is half-applied). That refusal is raised as
        :class:`RedisFullError`.

        ``durable`` (a send, a commit): with the replica wait on, wait for the replicas
        (see the module docstring); :class:`ReplicaWaitError` if too few confirmed."""
        wait = self.replica_wait if durable else 0
        sha = script.sha if self.router is None else script.cluster_sha

        # Staged with execute_command, not evalsha: the same call on a node's pipeline
        # and a cluster's (redis-py refuses evalsha in a cluster pipeline).
        evalsha = ("EVALSHA", sha, len(keys), *keys, *args)
        stage = (
            Commands(evalsha, ("WAIT", wait, self.replica_wait_ms)) if wait else Commands(evalsha)
        )

        for attempt in (0, 1):
            try:
                if self.router is not None:
                    reply = await self.router.execute(keys[0], stage)
                else:
                    reply = await self.batch.execute(stage)
                if not wait:
                    return reply
                if int(reply[1]) < wait:
                    raise ReplicaWaitError(
                        script.name, int(reply[1]), wait, self.replica_wait_ms, reply[0]
                    )
                return reply[0]
            except ResponseError as exc:
                if attempt or not _no_script(exc):
                    raise _full(exc) from None
                await self._reload(keys[0])
        raise AssertionError("unreachable")

    async def _run_chain(self, calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        """Several scripts in one round trip, in order, on one Redis (not a cluster, no
        replica wait): each one's reply, an error reply as its exception. The first
        one's error is raised, as :meth:`_run` raises it; if it is a ``NOSCRIPT`` (a
        Redis restarted: the first did not run, and the others must not have written
        without it, see ``Store.commit``), the scripts are loaded and all run again."""
        assert self.router is None and not self.replica_wait
        stage = Commands(
            *(("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls),
            keep_errors=True,
        )
        for attempt in (0, 1):
            replies: list[Any] = await self.batch.execute(stage)
            first = replies[0]
            if not isinstance(first, Exception):
                return replies
            if attempt or not (isinstance(first, ResponseError) and _no_script(first)):
                raise _full(first) if isinstance(first, ResponseError) else first
            await self._reload(calls[0][1][0])
        raise AssertionError("unreachable")

    async def _in_slot(self, key: str, stage: Stage) -> Any:
        """Plain commands of one slot (``key``'s): through the auto-pipeline, on a
        cluster to that slot's master (see ``routing.py``)."""
        if self.router is not None:
            return await self.router.execute(key, stage)
        return await self.batch.execute(stage)

    async def _per_partition(
        self, partitions: list[int], stage: Callable[[Pipeline, int], Any]
    ) -> list[Any]:
        """One command per partition (``stage(pipe, partition)``), a reply for each: in
        one pipeline, or on a cluster one per master. There a partition whose node
        fails gets an empty list (its items wait for the next pass); if every node
        fails, the first error is raised."""
        if self.router is None:
            pipe = self.redis.pipeline(transaction=False)
            for p in partitions:
                stage(pipe, p)
            return await pipe.execute()
        replies = await self.router.per_node({p: self.keys.slot_key(p) for p in partitions}, stage)
        errors = [r for r in replies.values() if isinstance(r, Exception)]
        if errors and len(errors) == len(partitions):
            raise errors[0]
        return [[] if isinstance(replies[p], Exception) else replies[p] for p in partitions]

    async def _every_partition(self, stage: Callable[[Pipeline, int], Any]) -> list[Any]:
        """One command per partition of the keyspace (``stage(pipe, partition)``), the
        replies in partition order: one pipeline, or on a cluster one per master (the
        masters in parallel; never a command over two slots). An error reply stays in
        its place, as the exception; a node that fails raises (a listing must not
        pass a failed master's partitions off as empty)."""
        partitions = list(range(self.keys.partitions))
        if self.router is None:
            pipe = self.redis.pipeline(transaction=False)
            for p in partitions:
                stage(pipe, p)
            return await pipe.execute(raise_on_error=False)
        replies = await self.router.per_node({p: self.keys.slot_key(p) for p in partitions}, stage)
        for reply in replies.values():
            if isinstance(reply, RedisConnectionError | RedisTimeoutError | OSError):
                raise reply
        return [replies[p] for p in partitions]

    async def _reload(self, key: str) -> None:
        """After ``NOSCRIPT``: a restarted Redis, or a replica promoted in a failover."""
        if self.router is None:
            await self.load_scripts()
        else:
            await self._load_on(await self.router.node_of(key))


def _no_script(exc: ResponseError) -> bool:
    return isinstance(exc, NoScriptError) or "NOSCRIPT" in str(exc)


def _full(exc: ResponseError) -> Exception:
    """A Redis at its ``maxmemory`` refused the script (:class:`RedisFullError`), or
    ``exc`` itself."""
    if isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM "):
        return RedisFullError(str(exc))
    return exc
