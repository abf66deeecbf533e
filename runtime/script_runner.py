"""Running the Lua scripts: each by its SHA1 through the auto-pipeline.

The scripts are loaded once at start-up (and again after a Redis restart lost
them), so a call sends only the SHA1, the keys and the arguments.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, OutOfMemoryError, ResponseError

from . import lua
from .batching import AutoPipeline
from .errors import RedisFullError
from .keys import Keyspace


class Script:
    """A Lua script and its SHA1, to run it by ``EVALSHA``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


SEND = Script(lua.SEND)
LOAD = Script(lua.LOAD)
COMMIT = Script(lua.COMMIT)
ACQUIRE = Script(lua.ACQUIRE)
RENEW = Script(lua.RENEW)
RELEASE = Script(lua.RELEASE)
HEARTBEAT = Script(lua.HEARTBEAT)
FIRE = Script(lua.FIRE)
DELETE = Script(lua.DELETE)
CANCEL_TIMER = Script(lua.CANCEL_TIMER)
SETTLE = Script(lua.SETTLE)
TOOL_DATA = Script(lua.TOOL_DATA)
RESUME = Script(lua.RESUME)
QUARANTINE = Script(lua.QUARANTINE)
CRON_UPSERT = Script(lua.CRON_UPSERT)
CRON_DELETE = Script(lua.CRON_DELETE)
CRON_PURGE = Script(lua.CRON_PURGE)
CRON_FIRE = Script(lua.CRON_FIRE)
CRON_QUARANTINE = Script(lua.CRON_QUARANTINE)
TRIM = Script(lua.TRIM)
ALL_SCRIPTS = (
    SEND,
    LOAD,
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
    CRON_UPSERT,
    CRON_DELETE,
    CRON_PURGE,
    CRON_FIRE,
    CRON_QUARANTINE,
)


class ScriptRunner:
    """The Redis client, the key layout and the script runner every store part shares."""

    def __init__(self, redis: Redis, keys: Keyspace) -> None:
        self.redis = redis
        self.keys = keys
        self.batch = AutoPipeline(redis)

    async def load_scripts(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for script in ALL_SCRIPTS:
            pipe.script_load(script.source)
        await pipe.execute()

    async def _run(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run a script through the auto-pipeline, reloading it after a Redis restart.

        A Redis at its ``maxmemory`` (``noeviction``) refuses the script's first write
        that could grow memory, before anything of it is written (the scripts carry no
        shebang flags, so Redis checks at each call, and once a script has written its
        later writes go through: no script is half-applied). That refusal is raised as
        :class:`RedisFullError`."""

        def stage(pipe: Pipeline) -> None:
            pipe.evalsha(script.sha, len(keys), *keys, *args)

        for attempt in (0, 1):
            try:
                return await self.batch.execute(stage)
            except NoScriptError:
                if attempt:
                    raise
                await self.load_scripts()
            except OutOfMemoryError as exc:
                raise RedisFullError(str(exc)) from None
            except ResponseError as exc:
                if str(exc).startswith("OOM "):
                    raise RedisFullError(str(exc)) from None
                if attempt or "NOSCRIPT" not in str(exc):
                    raise
                await self.load_scripts()
        raise AssertionError("unreachable")
