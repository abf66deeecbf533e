"""Redis connections for the runtime.

redis-py's asyncio client packs every command in Python; with many scripts of
15-20 arguments per wake that is a fifth of a worker's CPU. hiredis (a
required dependency) packs in C, so plain TCP connections use it.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection


class HiredisPackingConnection(Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if (isinstance(name, str) and " " in name) or (
            isinstance(name, bytes) and b" " in name
        ):  # e.g. "CONFIG GET": separate words
            args = (*name.split(), *args[1:])
        return [hiredis.pack_command(args)]


def connect(url: str) -> Redis:
    """A client for ``url``; ``redis://`` URLs pack commands with hiredis."""
    if url.startswith("redis://"):
        return Redis.from_url(
            url, decode_responses=False, connection_class=HiredisPackingConnection
        )
    return Redis.from_url(url, decode_responses=False)
