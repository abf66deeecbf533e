"""Redis going away and coming back, under a client and its gateway.

A private redis-server of the test's own (on another port) that the test kills and
starts again: while it is down every gateway route answers 503 ``RedisUnavailable``
with ``Retry-After`` and logs one warning line (no traceback); once it is back, the
first command of every kind (a plain read, a pipeline, a script) goes through,
because a pooled connection the old server closed is replaced before it is used.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.apps.harness import PrivateRedis
from tests.gateway_apps import http_for, register_echo
from wakeful import Registry, Runtime, Settings

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


@pytest.fixture
async def rt(private_redis: PrivateRedis) -> AsyncIterator[Runtime]:
    """A client (no worker) of the private server, with a registered ``echo`` type."""
    registry = Registry()
    register_echo(registry)
    settings = Settings(redis_url=private_redis.url, prefix="wkrestart", partitions=4)
    runtime = Runtime(registry, settings=settings, run_worker=False)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()


async def test_every_route_answers_503_with_retry_after_while_redis_is_down(
    private_redis: PrivateRedis, rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    await rt.send("/echo/x", "hi")
    private_redis.kill()
    caplog.set_level(logging.WARNING, logger="wakeful.gateway")
    requests = [
        ("GET", "/entities", None),
        ("GET", "/entities/echo", None),
        ("GET", "/entities/echo/x", None),
        ("GET", "/workers", None),
        ("POST", "/entities/echo/x/messages", {"payload": "again"}),
        ("POST", "/entities/echo/y", {}),
        ("GET", "/entities/echo/x/events?follow=0", None),
        ("GET", "/entities/echo/x/events?live=1", None),
        ("GET", "/entities/echo/x/overview", None),
    ]
    async with http_for(rt) as http:
        for method, path, body in requests:
            answer = await http.request(method, path, json=body)
            assert answer.status_code == 503, (path, answer.text)
            assert answer.json()["error"] == {
                "type": "RedisUnavailable",
                "message": "Redis is unreachable; try again",
            }
            assert answer.headers["retry-after"] == "5"
    # One warning line a request, naming the route; no traceback.
    records = [r for r in caplog.records if r.name == "wakeful.gateway"]
    assert len(records) == len(requests)
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in records)
    assert "GET /entities/echo/x: Redis is unreachable (ConnectionError" in records[2].getMessage()


async def test_an_event_stream_that_loses_redis_ends_with_a_warning(
    rt: Runtime, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its 200 is sent a stream cannot become a 503: it ends, the client resumes."""
    await rt.send("/echo/x", "hi")
    events = rt.events

    async def dropped(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for record in events(*args, **kwargs):
            yield record
            raise RedisConnectionError("Connection closed by server.")

    monkeypatch.setattr(rt, "events", dropped)
    caplog.set_level(logging.WARNING, logger="wakeful.gateway")
    async with http_for(rt) as http:
        answer = await http.get("/entities/echo/x/events?follow=0")
    assert answer.status_code == 200 and answer.text.count("event: ") == 1
    [record] = [r for r in caplog.records if r.name == "wakeful.gateway"]
    assert record.exc_info is None
    assert "event stream of /echo/x ended: Redis is unreachable" in record.getMessage()


async def test_the_first_commands_after_a_redis_restart_go_through(
    private_redis: PrivateRedis, rt: Runtime
) -> None:
    """Every pooled connection was closed by the old server: each is replaced before
    it is used (nothing was sent on it, so nothing can run twice)."""
    store = rt.store
    assert store is not None
    # Several connections in the pool, all idle.
    await asyncio.gather(*(rt.ownerships(["/echo/x"]) for _ in range(4)))
    private_redis.kill()
    private_redis.start()
    await asyncio.sleep(0.2)  # the event loop sees the old connections closed
    assert await rt.ownerships(["/echo/x"]) == [(False, None)]  # a pipeline
    assert await store.redis.get("wkrestart:nothing") is None  # a plain command
    await rt.send("/echo/x", "after the restart")  # a script
    await asyncio.gather(*(rt.ownerships(["/echo/x"]) for _ in range(4)))
    payloads = [getattr(r.event, "payload", None) async for r in rt.events("/echo/x")]
    assert payloads.count("after the restart") == 1


async def test_a_pooled_connection_whose_transport_was_closed_is_replaced(rt: Runtime) -> None:
    """The error users saw after a restart, ``Error UNKNOWN while writing to socket.
    Connection lost.`` from a pipeline: the event loop had closed an idle connection's
    transport (as it does when the server goes away under TLS), and the pool handed it
    out all the same."""
    store = rt.store
    assert store is not None
    pool = store.redis.connection_pool
    idle = [await pool.get_connection() for _ in range(2)]
    for connection in idle:
        await pool.release(connection)
        writer = connection._writer  # redis-py's stream: close its transport under it
        assert writer is not None
        writer.transport.abort()
    await asyncio.sleep(0)  # the transports close
    assert await rt.ownerships(["/echo/x"]) == [(False, None)]
    assert await rt.ownerships(["/echo/y"]) == [(False, None)]


def test_refused_credentials_are_a_503_that_names_them_not_an_outage():
    """redis-py derives AuthenticationError from ConnectionError: the gateway must not
    call wrong credentials "unreachable; try again", which no retry will fix."""
    from redis.exceptions import AuthenticationError
    from starlette.requests import Request

    from wakeful.gateway_responses import failure_response

    request = Request({"type": "http", "method": "GET", "path": "/entities", "headers": []})
    response = failure_response(request, AuthenticationError("invalid username-password pair"))
    assert response.status_code == 503
    assert b"refused the gateway's credentials" in response.body
    outage = failure_response(request, RedisConnectionError("Connection refused"))
    assert b"unreachable" in outage.body


def test_too_few_replicas_is_a_503_with_retry_after_not_a_bad_request():
    """A write its master took but too few replicas confirmed (``replica_wait``) is the
    servers' state, not the request's fault: 503 with Retry-After, and the message says
    to retry with the same idempotency key."""
    from starlette.requests import Request

    from wakeful.errors import ReplicaWaitError
    from wakeful.gateway_responses import failure_response

    request = Request({"type": "http", "method": "POST", "path": "/entities", "headers": []})
    response = failure_response(request, ReplicaWaitError("SEND", 0, 1, 500))
    assert response.status_code == 503
    assert response.headers["Retry-After"]
    assert b"same idempotency key" in response.body


async def test_a_wait_ends_on_refused_credentials_instead_of_timing_out(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait rides out lost connections until its timeout, but refused credentials
    (a ConnectionError to redis-py) are no outage: the wait raises them at once, not a
    timeout that would send the caller looking for a slow worker."""
    from redis.exceptions import AuthenticationError

    await rt.send("/echo/w", "hi")  # no worker: the entity does not come to rest
    real_status = rt.status
    calls = 0

    async def status(url: str, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:  # the password changed after the wait's first answer
            raise AuthenticationError("invalid username-password pair")
        return await real_status(url, **kwargs)

    monkeypatch.setattr(rt, "status", status)
    with pytest.raises(AuthenticationError):
        await rt.wait_idle("/echo/w", timeout=2.0)
