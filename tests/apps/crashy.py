"""A counter entity that makes duplicate application and concurrent wakes detectable.

Run by worker subprocesses as ``tests.apps.crashy:registry``. The handler keeps
its side effects in a separate Redis (``CRASHY_REDIS_URL``, keys under
``<WAKEFUL_PREFIX>:crashy:``) so a test can see what happened inside handlers
that never committed:

* ``starts`` (hash): ``<url> <message id>`` -> how many times a handler started
  on that message (stream ids are only unique within one entity log);
* ``calls:<url>``: handler invocations of the entity;
* ``inflight:<url>``: set with SET NX while a handler of the entity runs; a
  handler that finds it set increments ``overlaps`` (two wakes at once).

Durable state: ``seen`` holds one row per processed message, keyed by the
message's event id (a second application raises DuplicateKeyError, which the
log shows as a ``handler_error``); ``counts`` holds ``total``, incremented once per
message. Payload fields: ``i`` (any tag), ``sleep`` (seconds, only on the first
start of that message, so a replay after a crash runs fast), ``fail`` (raise on
the first ``fail`` starts of that message).

An ``agent`` entity runs a ``ScriptedModel`` (a tool call ``note``, then "done")
and records every model request in ``model_calls:<url>`` as ``<pid> <step>``. A
worker started with ``CRASHY_STOP_ONCE=<path>`` stops itself (SIGSTOP) once, right
before it asks the model for the step after its first tool result, creating
``<path>`` first: a pause that lands between a commit and a model request.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import Callable
from typing import Any

import msgspec
from redis.asyncio import Redis

from wakeful import (
    AgentTool,
    Collection,
    HandlerContext,
    Message,
    Registry,
    ScriptedModel,
    ToolResult,
)
from wakeful.models import ModelRequest, ModelResponse

INFLIGHT_PX = 10_000


class Seen(msgspec.Struct):
    id: str
    i: Any
    pid: int
    starts: int


class Count(msgspec.Struct):
    key: str
    n: int


def side_key(prefix: str, kind: str, url: str = "") -> str:
    return f"{prefix}:crashy:{kind}:{url}" if url else f"{prefix}:crashy:{kind}"


def build_registry(side_redis: Callable[[], Redis], prefix: str) -> Registry:
    reg = Registry()

    @reg.entity(
        "counter",
        description="counts messages, records each message id once",
        state={
            "seen": Collection(primary_key="id", row=Seen),
            "counts": Collection(row=Count),
        },
    )
    async def counter(ctx: HandlerContext) -> None:
        r = side_redis()
        url = ctx.entity_url
        marker = side_key(prefix, "inflight", url)
        mine = f"{os.getpid()}:{secrets.token_hex(4)}"
        if not await r.set(marker, mine, nx=True, px=INFLIGHT_PX):
            await r.incr(side_key(prefix, "overlaps"))
            await r.rpush(side_key(prefix, "overlap_log"), f"{url} {mine}")
        await r.incr(side_key(prefix, "calls", url))
        try:
            for record in ctx.wake.events:
                if not isinstance(record.event, Message):
                    continue
                payload = record.event.payload if isinstance(record.event.payload, dict) else {}
                starts = await r.hincrby(side_key(prefix, "starts"), f"{url} {record.id}", 1)
                if starts <= payload.get("fail", 0):
                    raise RuntimeError(f"planned failure {starts} of {record.id}")
                if starts == 1 and payload.get("sleep"):
                    await asyncio.sleep(payload["sleep"])
                ctx.db.actions.seen_insert(
                    row=Seen(id=record.id, i=payload.get("i"), pid=os.getpid(), starts=starts)
                )
                if later := payload.get("later"):  # a durable timer back to this entity
                    await ctx.send(url, {"i": later["i"]}, after=later["after"])
                if "total" in ctx.db.collections.counts:
                    ctx.db.actions.counts_update(
                        key="total", updater=lambda c: setattr(c, "n", c.n + 1)
                    )
                else:
                    ctx.db.actions.counts_insert(row=Count("total", 1))
        finally:
            if await r.get(marker) == mine.encode():
                await r.delete(marker)

    noted: list[str] = []  # tool calls this process ran

    async def respond(request: ModelRequest, url: str) -> ModelResponse:
        steps = sum(1 for m in request.messages if m["role"] == "assistant")
        await side_redis().rpush(side_key(prefix, "model_calls", url), f"{os.getpid()} {steps}")
        if steps == 0:
            call = {"type": "tool_use", "id": "n1", "name": "note", "input": {}}
            return ModelResponse(content=[call], stop_reason="tool_use")
        return ModelResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")

    async def note(call_id: str, params: Any, signal_: Any, on_update: Any) -> ToolResult:
        noted.append(call_id)
        return ToolResult("noted")

    async def enabled() -> bool:
        stop_file = os.environ.get("CRASHY_STOP_ONCE")
        if stop_file and noted:  # after the tool's result: the next model request
            try:
                os.close(os.open(stop_file, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return True
            os.kill(os.getpid(), signal.SIGSTOP)  # no await in between: resumes right here
        return True

    @reg.entity("agent", description="a scripted agent run with one tool call")
    async def agent(ctx: HandlerContext) -> None:
        url = ctx.entity_url
        model = ScriptedModel(lambda request: respond(request, url))
        tool = AgentTool("note", "Notes.", {"type": "object"}, note, enabled=enabled)
        ctx.use_agent("You note.", model=model, tools=[tool])
        await ctx.agent.run()

    return reg


_side: Redis | None = None


def _env_redis() -> Redis:
    global _side
    if _side is None:
        _side = Redis.from_url(os.environ["CRASHY_REDIS_URL"])
    return _side


registry = build_registry(_env_redis, os.environ.get("WAKEFUL_PREFIX", "wk"))
