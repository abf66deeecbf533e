"""The embedded default: an in-process fakeredis, for demos, tests and notebooks.

Nothing is kept when the process exits. Two runtimes share data only if they
are given the same :class:`fakeredis.FakeServer`.
"""

from __future__ import annotations

import fakeredis
from fakeredis.aioredis import FakeRedis
from redis.asyncio import BlockingConnectionPool


def embedded_redis(server: fakeredis.FakeServer | None = None) -> FakeRedis:
    """A fakeredis client of ``server`` (a new, empty one by default). Its pool queues,
    as the runtime's real connections do: a caller waits for a free connection."""
    return FakeRedis(
        server=server or fakeredis.FakeServer(),
        decode_responses=False,
        connection_pool_class=BlockingConnectionPool,
    )
