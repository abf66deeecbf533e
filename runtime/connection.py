"""Redis connections for the runtime, and the one rule for their timeouts.

redis-py's asyncio client packs every command in Python; with many scripts of
15-20 arguments per wake that is a fifth of a worker's CPU. hiredis (a
required dependency) packs in C, so plain TCP connections use it.

Timeouts are set here and nowhere else. A connection gives up on a reply after
``socket_timeout_s``; a blocking read (XREAD / XREADGROUP ``BLOCK``) therefore
blocks for at most half of its connection's socket timeout (:func:`block_ms`),
and whoever follows a stream reads again. The pool queues: a caller that finds
every connection busy waits up to ``pool_timeout_s`` for one instead of failing,
and it never hands out a connection the server closed (a Redis restarted):
:class:`CheckedPool` reconnects it first. Nothing is ever sent twice.

A Redis Cluster is chosen by the URL: ``redis+cluster://[user:password@]host:port
[,host:port...][?options]`` (``rediss+cluster://`` for TLS), one or more seed nodes.
:func:`connect` then returns a :class:`ClusterClient` (a redis-py ``RedisCluster``
that packs with hiredis too and remembers how it was made, so :func:`dedicated` and
the per-node clients of ``routing.py`` connect alike). The runtime's modules keep
their ``Redis`` annotations: a ``ClusterClient`` answers the same commands, and the
few places that must tell the two apart ask :func:`is_cluster`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit, urlunsplit

import hiredis
import redis.exceptions
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection
from redis.connection import parse_url

from .errors import ConfigError
from .redaction import redact, redact_url, url_secrets

# Redis did not answer (refused, reset, timed out), or a cluster is not serving now (a
# failover or a slot migration under way: CLUSTERDOWN, MASTERDOWN, TRYAGAIN, a MOVED /
# ASK left over, no reachable node). Nothing is wrong with the request: it can be tried
# again. The CLI exits 6 on these, the gateway answers 503 with Retry-After.
# Redis answered and refused the URL's user name or password (WRONGPASS, NOAUTH; a user
# name given to a Redis before 6): a setting to fix, not an outage. redis-py derives
# them from ConnectionError, so they are caught before UNREACHABLE_ERRORS.
AUTHENTICATION_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)
CLUSTER_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ClusterError,  # ClusterDownError, MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # MovedError
    redis.exceptions.RedisClusterException,  # e.g. no seed node answers
)


_DEADLINE_SLACK_S = 0.001
"""How late a batch's read deadline may run behind "``socket_timeout`` after the last
reply" (see :meth:`HiredisPackingConnection.read_replies`)."""


class HiredisPackingConnection(Connection):
    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """redis-py's, with its write timeout as ``asyncio.timeout``: redis-py bounds the
        write with ``asyncio.wait_for``, which on Python 3.11 wraps it in a task of its
        own, a task per command (a fifth of a lone command's client CPU)."""
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        if check_health:
            await self.check_health()
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        writer = self._writer
        if writer is None:  # disconnected meanwhile (a concurrent disconnect)
            raise redis.exceptions.ConnectionError("Connection closed while writing")
        try:
            async with asyncio.timeout(self.socket_timeout):
                writer.writelines(command)
                await writer.drain()
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise redis.exceptions.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            errno, message = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
            raise redis.exceptions.ConnectionError(
                f"Error {errno} while writing to socket. {message}."
            ) from exc
        except BaseException:  # e.g. cancelled mid-write: what was sent is unknown
            await self.disconnect(nowait=True)
            raise

    async def read_replies(self, n: int) -> list[Any]:
        """The next ``n`` replies, an error reply as its :class:`ResponseError` (as a
        pipeline's ``raise_on_error=False`` gives it). Each reply may take
        ``socket_timeout`` after the one before, as with redis-py's ``read_response``,
        which sets up a timeout of its own for every reply: a timer scheduled and
        cancelled each time (an auto-pipeline's batch reads one reply per wake). Here
        one timer is moved on only when replies come apart in time (the replies of a
        batch mostly come in one read; a batch of replica WAITs takes one wait each).
        Like ``read_response``, it disconnects on any failure: replies may still be on
        their way."""
        parser: Any = self._parser
        timeout = self.socket_timeout
        clock = asyncio.get_running_loop().time
        replies: list[Any] = []
        try:
            async with asyncio.timeout(timeout) as deadline:
                moved = clock()
                for _ in range(n):
                    replies.append(await parser.read_response())
                    if timeout is not None and clock() - moved > _DEADLINE_SLACK_S:
                        moved = clock()
                        deadline.reschedule(moved + timeout)
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise redis.exceptions.TimeoutError(
                f"Timeout reading from {self._host_error()}"
            ) from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            raise redis.exceptions.ConnectionError(
                f"Error while reading from {self._host_error()} : {exc.args}"
            ) from exc
        except BaseException:
            await self.disconnect(nowait=True)
            raise
        return replies

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if (isinstance(name, str) and " " in name) or (
            isinstance(name, bytes) and b" " in name
        ):  # e.g. "CONFIG GET": separate words
            args = (*name.split(), *args[1:])
        return [hiredis.pack_command(args)]


class CheckedPool(BlockingConnectionPool):
    """A queueing pool that never hands out a connection the server has closed.

    redis-py checks a pooled connection before handing it out (``ensure_connection``:
    one with data or EOF waiting is reconnected), but skips that check when its
    maintenance notifications are on, and they are (``"auto"``) on every connection
    of redis-py 8's default protocol, RESP3. So after a Redis restart the first
    command on each idle connection failed (``Connection closed by server`` on the
    reply, or ``Connection lost`` writing to a transport already closed), and with
    no retry configured (redis-py's default ``Retry`` belongs to ``Redis()``, not to a
    pool made here) the caller got the error.

    A connection the event loop has seen closed (EOF, a reset) is reconnected here,
    before anything is sent on it, so it is safe for every command. redis-py's retry
    is deliberately not turned on instead: it also re-sends a command whose
    connection broke after it was sent, which Redis may have run, and not every
    write is safe twice (a send without an idempotency key, an ``XREADGROUP`` that
    delivered a batch). A connection that breaks during a command stays an error:
    the caller's to retry (a worker does; the gateway answers 503)."""

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        if closed_by_server(connection):
            await connection.disconnect()  # super() connects it again
        await super().ensure_connection(connection)


def closed_by_server(connection: AbstractConnection) -> bool:
    """Whether the event loop has seen ``connection`` closed (EOF or an error) from
    the other end. redis-py keeps the streams in ``_reader`` and ``_writer``."""
    reader = getattr(connection, "_reader", None)
    writer = getattr(connection, "_writer", None)
    if not isinstance(reader, asyncio.StreamReader) or not isinstance(writer, asyncio.StreamWriter):
        return False  # not connected (connect() opens it), or no socket (fakeredis)
    return reader.at_eof() or reader.exception() is not None or writer.is_closing()


def connect(
    url: str,
    *,
    socket_timeout_s: float = 10.0,
    max_connections: int = 100,
    pool_timeout_s: float = 20.0,
) -> Redis:
    """A client for ``url`` with its own queueing pool; ``redis://`` URLs pack commands
    with hiredis. The defaults are those of :class:`~wakeful.config.Settings`. A
    malformed URL is a :class:`~wakeful.errors.ConfigError` that never shows its password."""
    _refuse_decoding(url)
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        "max_connections": max_connections,
        "timeout": pool_timeout_s,
    }
    if url.startswith(CLUSTER_SCHEMES):
        return connect_cluster(
            url,
            socket_timeout_s=socket_timeout_s,
            max_connections=max_connections,
        )
    if url.startswith("redis://"):
        options["connection_class"] = HiredisPackingConnection
    try:
        pool = CheckedPool.from_url(url, **options)
    except ValueError as exc:  # urllib's or redis-py's words may quote the password
        problem = redact(str(exc), url_secrets(url))
        raise ConfigError(f"Redis URL {redact_url(url)} is malformed: {problem}") from None
    return Redis.from_pool(pool)


def _refuse_decoding(url: str) -> None:
    """A URL's query options override the client's (redis-py), and the runtime reads
    replies as bytes (msgpack, stream ids): ``?decode_responses=true`` made every
    command fail with a UnicodeDecodeError traceback."""
    try:
        query = urlsplit(url).query
    except ValueError:  # malformed: parsing it says why, without its password
        return
    if "decode_responses" in parse_qs(query):
        raise ConfigError(
            f"Redis URL {redact_url(url)}: Wakeful reads replies as bytes; "
            "leave decode_responses out of the URL"
        )


CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


class ClusterClient(RedisCluster):
    """A ``RedisCluster`` that remembers its seeds and options (to make more clients
    like it: :func:`dedicated`, the per-node clients of ``routing.py``)."""

    seeds: list[tuple[str, int]]
    options: dict[str, Any]

    def node_options(self) -> dict[str, Any]:
        """The options of a plain ``Redis`` client of one of this cluster's nodes."""
        options = dict(self.options)
        options.pop("max_connections", None)
        return options


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes and the client options of a ``redis+cluster://`` URL.

    The options are those redis-py reads from a ``redis://`` URL (user, password,
    TLS, query options), taken from the URL with its first seed as the host."""
    scheme, _, rest = url.partition("://")
    parts = urlsplit(f"{scheme.removesuffix('+cluster')}://{rest}")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ValueError("it names no node (expected host:port[,host:port...])")
    seeds: list[tuple[str, int]] = []
    for seed in hosts.split(","):
        host, colon, port = seed.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"node {seed!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if parts.path not in ("", "/", "/0"):
        raise ValueError("a Redis Cluster has database 0 only: leave the path out")
    first = f"{userinfo}{at}{hosts.split(',')[0]}"
    options = parse_url(urlunsplit((parts.scheme, first, "", parts.query, "")))
    options.pop("db", None)
    options.pop("connection_class", None)  # redis-py's sync class for rediss://
    if parts.scheme == "rediss":
        options["ssl"] = True
    options.pop("host", None)
    options.pop("port", None)
    return seeds, options


def connect_cluster(url: str, *, socket_timeout_s: float, max_connections: int) -> Redis:
    """A :class:`ClusterClient` of the cluster that the seeds of ``url`` belong to
    (``max_connections`` per node). Typed as ``Redis``: see the module docstring."""
    try:
        seeds, options = parse_cluster_url(url)
    except ValueError as exc:
        problem = redact(str(exc), url_secrets(url))
        raise ConfigError(f"Redis URL {redact_url(url)} is malformed: {problem}") from None
    options.update(
        decode_responses=False,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
        max_connections=max_connections,
    )
    return cast("Redis", _cluster(seeds, options))


def _cluster(seeds: list[tuple[str, int]], options: dict[str, Any]) -> ClusterClient:
    client = ClusterClient(startup_nodes=[ClusterNode(h, p) for h, p in seeds], **options)
    client.seeds, client.options = seeds, options
    if not options.get("ssl"):  # pack with hiredis, on the seeds and on nodes found later
        client.connection_kwargs["connection_class"] = HiredisPackingConnection
        for node in client.startup_nodes:
            node.connection_class = HiredisPackingConnection
    return client


def is_cluster(redis: object) -> bool:
    """Whether ``redis`` is a client of a Redis Cluster (see :func:`connect`)."""
    return isinstance(redis, RedisCluster)


def node_client(cluster: ClusterClient, host: str, port: int, max_connections: int) -> Redis:
    """A plain client of one node of ``cluster`` (a :class:`ClusterClient`), with the
    cluster's options and a queueing pool of its own."""
    options = cluster.node_options()
    ssl = options.pop("ssl", False)
    kind = SSLConnection if ssl else HiredisPackingConnection
    pool = CheckedPool(
        connection_class=kind,
        host=host,
        port=port,
        max_connections=max_connections,
        timeout=options.pop("timeout", 20.0),
        **options,
    )
    return Redis.from_pool(pool)


def dedicated(redis: Redis, max_connections: int) -> Redis:
    """A client of the same server as ``redis`` with a small pool of its own: traffic
    that must never queue behind other callers (lease renewal) gets connections that
    no one else takes (on a cluster: a small pool per node)."""
    if isinstance(redis, ClusterClient):
        return cast(
            "Redis", _cluster(redis.seeds, {**redis.options, "max_connections": max_connections})
        )
    pool = redis.connection_pool
    own = CheckedPool(
        connection_class=pool.connection_class,
        max_connections=max_connections,
        timeout=getattr(pool, "timeout", None),
        **pool.connection_kwargs,
    )
    return Redis.from_pool(own)


def block_ms(redis: Redis, requested: int) -> int:
    """How long a blocking read on ``redis`` may block: ``requested``, but at most half
    the socket timeout of its connections, so that the reply always comes in time
    (``0``, "forever" to Redis, becomes that longest block)."""
    if isinstance(redis, ClusterClient):
        timeout = redis.options.get("socket_timeout")
    else:
        timeout = redis.connection_pool.connection_kwargs.get("socket_timeout")
    if not timeout:
        return requested
    longest = max(1, int(timeout * 500))
    return longest if requested <= 0 else min(requested, longest)
