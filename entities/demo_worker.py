"""What the demo's worker processes run: ``wakeful worker wakeful.entities.demo_worker``.

The ready entity types of :mod:`wakeful.entities`, with each agent's model
wrapped so that every call is recorded before it is made, in the list
``<prefix>:demo:model-calls`` of the worker's Redis (which process, which
entity, the call's number in its process). The demo counts the model calls
there: they happened in the worker processes, the one it kills included, and
a record is in Redis before the call's answer can be journaled, so what the demo
reads after a run finished holds every call of that run.

With ``WAKEFUL_DEMO_STALL=<entity url>`` the first model call of that entity
that follows a tool result is recorded as stalled and never answered, as a
slow model would: the demo kills the process there, after the tool call was
committed and before the next step is.

With ``WAKEFUL_DEMO_WATCH_STDIN=1`` the process exits when its stdin closes: the
demo holds the other end of that pipe, so a demo that dies (even by ``kill -9``)
leaves no worker behind, retrying a Redis that went with it.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable

import anyio
import msgspec
from redis.asyncio import Redis

from wakeful import Registry, Settings
from wakeful.connection import connect
from wakeful.entities import assistant, notes
from wakeful.models import Model, ModelRequest, ModelResponse

STALL_VAR = "WAKEFUL_DEMO_STALL"
WATCH_VAR = "WAKEFUL_DEMO_WATCH_STDIN"


class ModelCall(msgspec.Struct):
    """One model call, as a worker process records it."""

    pid: int
    n: int  # the call's number in its process, from 1
    url: str  # the entity whose agent asked
    model: str
    stalled: bool = False  # never answered: the process waits to be killed
    # The model steps before this one in the conversation (assistant messages in the
    # request): a call with fewer than the journal holds asks for a journaled step again.
    prior: int = 0


def calls_key(prefix: str) -> str:
    """The Redis list of the model calls of the demo's keyspace ``prefix``."""
    return f"{prefix}:demo:model-calls"


async def recorded_calls(redis: Redis, prefix: str) -> list[ModelCall]:
    """Every model call the worker processes recorded, oldest first."""
    raw = await redis.lrange(calls_key(prefix), 0, -1)
    return [msgspec.json.decode(item, type=ModelCall) for item in raw]


class _Recorder:
    """This process's connection to the demo's Redis, opened at the first call."""

    def __init__(self) -> None:
        self.numbers = itertools.count(1)
        self.stalled: set[str] = set()  # entities whose call stalled already (once each)
        self._redis: Redis | None = None
        self._key = ""

    async def record(self, call: ModelCall) -> None:
        if self._redis is None:
            settings = Settings.from_env()
            if settings.redis_url is None:
                raise RuntimeError("the demo's worker runs with WAKEFUL_REDIS_URL set")
            self._redis = connect(settings.redis_url, max_connections=4)
            self._key = calls_key(settings.prefix)
        await self._redis.rpush(self._key, msgspec.json.encode(call))


_recorder = _Recorder()


class RecordedModel:
    """``inner``, each call recorded first (and the chosen one stalled)."""

    def __init__(self, inner: Model, url: str) -> None:
        self.inner = inner
        self.url = url
        self.name = inner.name

    async def complete(
        self, request: ModelRequest, *, on_text: Callable[[str], None] | None = None
    ) -> ModelResponse:
        stall = self._stalls(request)
        number = next(_recorder.numbers)
        prior = sum(message["role"] == "assistant" for message in request.messages)
        call = ModelCall(os.getpid(), number, self.url, self.name, stall, prior)
        await _recorder.record(call)
        if stall:
            await anyio.sleep_forever()  # the demo kill -9s this process while it waits
        return await self.inner.complete(request, on_text=on_text)

    def _stalls(self, request: ModelRequest) -> bool:
        if os.environ.get(STALL_VAR) != self.url or self.url in _recorder.stalled:
            return False
        content = request.messages[-1]["content"] if request.messages else ""
        after_tool = not isinstance(content, str) and any(
            block.get("type") == "tool_result" for block in content
        )
        if after_tool:
            _recorder.stalled.add(self.url)
        return after_tool


def _exit_with_the_demo() -> None:
    """Block until stdin closes (the demo is gone), then end this process at once.
    ``os.read`` on the descriptor, not ``sys.stdin``: a daemon thread blocked inside a
    buffered reader aborts the interpreter's own exit (it cannot take the reader's lock)."""
    fd = sys.stdin.fileno()
    while os.read(fd, 4096):
        pass
    os._exit(1)


if os.environ.get(WATCH_VAR) == "1":
    threading.Thread(target=_exit_with_the_demo, name="demo-watch", daemon=True).start()

registry = Registry()
notes.register(registry)
assistant.register(registry, wrap_model=RecordedModel)
