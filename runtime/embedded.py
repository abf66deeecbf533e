"""The embedded default: an in-process fakeredis, for demos, tests and notebooks.

Nothing is kept when the process exits. Two runtimes share data only if they
are given the same :class:`fakeredis.FakeServer`, or if one process serves it
to others over TCP (:class:`SharedEmbedded`).
"""

from __future__ import annotations

import threading

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


class SharedEmbedded:
    """The embedded Redis served on a local TCP port, so other processes can use it.

    An in-process fakeredis is private to its process; worker processes (the demo's,
    which it kills with ``kill -9``) reach this one at :attr:`url` while the process
    that serves it lives. Use it as a context manager: the server thread stops on exit.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._server = fakeredis.TcpFakeServer((host, port), server_type="redis")
        self._server.daemon_threads = True  # a connection left open never blocks exit
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="wakeful-embedded-tcp", daemon=True
        )

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self._host}:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def __enter__(self) -> SharedEmbedded:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
