"""Redis connections for the runtime, and the one rule for their timeouts.

redis-py's asyncio client packs every command in Python; with many scripts of
15-20 arguments per wake that is a fifth of a worker's CPU. hiredis (a
required dependency) packs in C, so plain TCP connections use it.

Timeouts are set here and nowhere else. A connection gives up on a reply after
``socket_timeout_s``; a blocking read (XREAD / XREADGROUP ``BLOCK``) therefore
blocks for at most half of its connection's socket timeout (:func:`block_ms`),
and whoever follows a stream reads again. The pool queues: a caller that finds
every connection busy waits up to ``pool_timeout_s`` for one instead of failing.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection

from .errors import ConfigError
from .redaction import redact, redact_url, url_secrets


class HiredisPackingConnection(Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if (isinstance(name, str) and " " in name) or (
            isinstance(name, bytes) and b" " in name
        ):  # e.g. "CONFIG GET": separate words
            args = (*name.split(), *args[1:])
        return [hiredis.pack_command(args)]


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
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        "max_connections": max_connections,
        "timeout": pool_timeout_s,
    }
    if url.startswith("redis://"):
        options["connection_class"] = HiredisPackingConnection
    try:
        pool = BlockingConnectionPool.from_url(url, **options)
    except ValueError as exc:  # urllib's or redis-py's words may quote the password
        problem = redact(str(exc), url_secrets(url))
        raise ConfigError(f"Redis URL {redact_url(url)} is malformed: {problem}") from None
    return Redis.from_pool(pool)


def dedicated(redis: Redis, max_connections: int) -> Redis:
    """A client of the same server as ``redis`` with a small pool of its own: traffic
    that must never queue behind other callers (lease renewal) gets connections that
    no one else takes."""
    pool = redis.connection_pool
    own = BlockingConnectionPool(
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
    timeout = redis.connection_pool.connection_kwargs.get("socket_timeout")
    if not timeout:
        return requested
    longest = max(1, int(timeout * 500))
    return longest if requested <= 0 else min(requested, longest)
