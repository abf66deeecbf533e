"""Health, readiness and metrics (gateway and worker), and the gateway's other new routes:
DELETE an entity, resume a failed one, JSON errors for unknown routes and methods."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.apps.harness import free_port
from tests.gateway_apps import http_for
from wakeful import AgentTool, HandlerContext, Registry, ScriptedModel, ToolResult, metrics
from wakeful.errors import EntityNotFoundError
from wakeful.models import ModelError, ModelResponse, Usage

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


class Nothing(msgspec.Struct):
    pass


async def broken_tool(call_id: str, params: Nothing, signal: Any, on_update: Any) -> ToolResult:
    return ToolResult("the tool is out of order", is_error=True)


def refuse(request: object) -> None:
    raise ModelError("the model is down", retryable=False, model="down")


def registry() -> Registry:
    reg = Registry()

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "later":
                await ctx.send(ctx.entity_url, "woken", after=3600)
            elif m.payload == "spawn":
                await ctx.spawn("echo", f"{ctx.entity_id}-kid", initial_message="hi")
            ctx.reply(f"echo {m.payload}")

    @reg.entity("fragile")
    async def fragile(ctx: HandlerContext) -> None:
        if any(m.payload == "boom" for m in ctx.wake.messages):
            raise RuntimeError("boom")

    model = ScriptedModel(
        [
            ModelResponse(
                content=[{"type": "tool_use", "id": "t1", "name": "broken", "input": {}}],
                stop_reason="tool_use",
                usage=Usage(input_tokens=11, output_tokens=7),
            ),
            ModelResponse(
                content=[{"type": "text", "text": "It is broken."}],
                stop_reason="end_turn",
                usage=Usage(input_tokens=13, output_tokens=5),
            ),
        ],
        name="metered",
    )

    @reg.entity("agent")
    async def agent(ctx: HandlerContext) -> None:
        tool = AgentTool("broken", "a tool that fails", Nothing, broken_tool)
        ctx.use_agent(system_prompt="", model=model, tools=[tool])
        await ctx.agent.run()

    @reg.entity("down")
    async def down(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="", model=ScriptedModel(refuse, name="down"), tools=[])
        await ctx.agent.run()

    return reg


def gateway(rt: Any) -> httpx.AsyncClient:
    return http_for(rt)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def until(check: Any, timeout: float = 30.0) -> Any:
    """Poll ``check()`` (async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.05)


# -- JSON errors, DELETE, resume ---------------------------------------------------


async def test_unknown_routes_and_wrong_methods_answer_json_errors(cluster):
    rt = await cluster.runtime(registry())
    async with gateway(rt) as http:
        missing = await http.get("/no/such/route")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "NotFound"
        assert "/no/such/route" in missing.json()["error"]["message"]
        wrong = await http.put("/entities/echo/e1", json={})
        assert wrong.status_code == 405
        assert wrong.json()["error"]["type"] == "MethodNotAllowed"
        assert set(wrong.headers["allow"].replace(" ", "").split(",")) == {
            "GET",
            "HEAD",
            "POST",
            "DELETE",
        }
        assert (await http.get("/entities/echo/e1/cancel")).json()["error"]["type"] == (
            "MethodNotAllowed"
        )


async def test_delete_an_entity_over_http(cluster):
    rt = await cluster.runtime(registry())
    async with gateway(rt) as http:
        await rt.send("/echo/d1", "hello")
        await rt.wait_idle("/echo/d1")
        deleted = await http.delete("/entities/echo/d1")
        assert deleted.status_code == 202
        assert deleted.json() == {"url": "/echo/d1", "deleting": True}

        async def gone() -> bool:
            return (await http.get("/entities/echo/d1")).status_code == 404

        await until(gone)
        with pytest.raises(EntityNotFoundError):
            await rt.status("/echo/d1")
        again = await http.delete("/entities/echo/d1")
        assert again.status_code == 404 and again.json()["error"]["type"] == "EntityNotFoundError"
        bad = await http.delete("/entities/echo/bad%20id")
        assert bad.status_code == 400


async def test_resume_a_failed_entity_over_http(cluster):
    rt = await cluster.runtime(registry(), max_attempts=1)
    async with gateway(rt) as http:
        boom = await rt.send("/fragile/f1", "boom")
        assert (await rt.wait_idle("/fragile/f1")).status == "failed"
        not_bool = await http.post("/entities/fragile/f1/resume", json={"skip_failed": "yes"})
        assert not_bool.status_code == 400 and "skip_failed" in not_bool.text
        resumed = await http.post("/entities/fragile/f1/resume", json={"skip_failed": True})
        assert resumed.status_code == 200, resumed.text
        body = resumed.json()
        assert body["resumed"] is True and boom in body["skipped"]
        assert (await rt.wait_idle("/fragile/f1")).status == "idle"
        twice = await http.post("/entities/fragile/f1/resume", json={})
        assert twice.status_code == 409 and twice.json()["error"]["type"] == "NotFailedError"
        missing = await http.post("/entities/fragile/nobody/resume", json={})
        assert missing.status_code == 404


# -- health and readiness ----------------------------------------------------------


async def test_healthz_and_readyz_on_the_gateway(cluster):
    client_only = await cluster.runtime(registry(), run_worker=False)
    async with gateway(client_only) as http:
        health = await http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "alive"})
        unready = await http.get("/readyz")  # no worker: no partition is leased
        assert unready.status_code == 503
        assert unready.json()["unserved"] == [0, 1, 2, 3]
        assert unready.json()["redis"] == "ok"

        await cluster.runtime(registry())  # a worker joins

        async def ready() -> httpx.Response | None:
            response = await http.get("/readyz")
            return response if response.status_code == 200 else None

        report = (await until(ready)).json()
        assert report == {"ready": True, "redis": "ok", "unserved": []}


# -- metrics ---------------------------------------------------------------------


async def test_metrics_on_the_gateway_report_every_family(cluster):
    worker = await cluster.runtime(registry(), max_attempts=1)
    async with gateway(worker) as http:
        before = (await http.get("/metrics")).text
        await worker.send("/echo/m1", "spawn")
        await worker.send("/echo/m2", "later")
        await worker.send("/fragile/m3", "boom")
        await worker.send("/agent/m4", "go")
        await worker.send("/down/m5", "go")
        for url in ("/echo/m1", "/echo/m1-kid", "/fragile/m3", "/agent/m4", "/down/m5"):
            await worker.wait_idle(url)
        await worker.wait_idle("/echo/m1-kid")
        scraped = await http.get("/metrics")
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    text = scraped.text

    def grew(name: str, by: float = 1, **labels: str) -> bool:
        return value(text, name, **labels) - value(before, name, **labels) >= by

    assert grew("wakeful_wakes_total", 5, outcome="ok")
    assert grew("wakeful_wake_duration_seconds_count", 5)
    assert grew("wakeful_wake_latency_seconds_count", 5)
    assert grew("wakeful_commit_duration_seconds_count", 5)
    assert grew("wakeful_effects_delivered_total", kind="spawn")
    assert grew("wakeful_entities_parked_total")
    assert grew("wakeful_model_tokens_total", 24, model="metered", direction="input")
    assert grew("wakeful_model_tokens_total", 12, model="metered", direction="output")
    assert grew("wakeful_model_errors_total", model="down", retryable="false")
    assert grew("wakeful_tool_calls_total", tool="broken")
    assert grew("wakeful_tool_errors_total", tool="broken")
    assert "wakeful_redeliveries_total" in text
    # The keyspace, read from Redis at the scrape.
    partition = worker.store.keys.partition("/echo/m2")
    assert value(text, "wakeful_timers_pending", partition=str(partition)) == 1
    assert sum(value(text, "wakeful_timers_pending", partition=str(p)) for p in range(4)) == 1
    assert all(value(text, "wakeful_inbox_lag", partition=str(p)) == 0 for p in range(4))
    assert {name for name, _ in samples(text)} >= {"wakeful_pending_pointers"}
    assert value(text, "wakeful_leases_held", worker=worker.worker.id) == 4
    assert value(text, "wakeful_partitions_unserved") == 0


async def test_inbox_lag_counts_pointers_no_worker_has_read(cluster):
    client_only = await cluster.runtime(registry(), run_worker=False)
    for p in range(4):
        await client_only.store.ensure_group(p)
    await client_only.send("/echo/waiting", "hello")
    partition = client_only.store.keys.partition("/echo/waiting")
    async with gateway(client_only) as http:
        text = (await http.get("/metrics")).text
    assert value(text, "wakeful_inbox_lag", partition=str(partition)) == 1
    assert value(text, "wakeful_pending_pointers", partition=str(partition)) == 0
    assert value(text, "wakeful_partitions_unserved") == 4


def test_a_worker_serves_health_readiness_and_metrics_on_its_port(server_url, prefix):
    port = free_port()
    env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}
    command = ["worker", "wakeful.entities:registry", "--redis", server_url]
    worker = subprocess.Popen(
        [sys.executable, "-m", "wakeful.cli", *command, "--metrics-port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert worker.poll() is None, worker.communicate()
            try:
                ready = httpx.get(f"{base}/readyz", timeout=5)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the worker never got ready"
            time.sleep(0.05)
        assert ready.json()["worker"] == "ready"
        assert httpx.get(f"{base}/healthz", timeout=5).json() == {"status": "alive"}
        text = httpx.get(f"{base}/metrics", timeout=5).text
        assert sum(value(text, "wakeful_leases_held", worker=w) for w in _workers(text)) == 4
        assert "wakeful_wakes_total" in text or "# HELP wakeful_wakes" in text
        assert httpx.get(f"{base}/nothing", timeout=5).status_code == 404
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err


def _workers(text: str) -> set[str]:
    return {
        dict(labels)["worker"] for name, labels in samples(text) if name == "wakeful_leases_held"
    }


def test_a_metrics_port_in_use_fails_the_worker_before_it_starts(server_url, prefix):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}
        command = ["worker", "wakeful.entities:registry", "--redis", server_url]
        done = subprocess.run(
            [sys.executable, "-m", "wakeful.cli", *command, "--metrics-port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1" in done.stderr
    assert "worker" not in done.stdout  # it never started


def test_a_histogram_counts_each_value_in_its_bucket_and_every_one_above():
    """Wakeful's own histogram (observed on the worker's loop, without locks) renders
    as the Prometheus text format's histogram: cumulative buckets, a value equal to a
    bound in that bound's bucket, and the count and sum."""
    registry = CollectorRegistry()
    histogram = metrics.Histogram("t_seconds", "test", buckets=(0.1, 1, 10), registry=registry)
    for amount in (0.05, 0.1, 0.5, 20):
        histogram.observe(amount)
    text = generate_latest(registry).decode()
    assert value(text, "t_seconds_bucket", le="0.1") == 2
    assert value(text, "t_seconds_bucket", le="1.0") == 3
    assert value(text, "t_seconds_bucket", le="10.0") == 3
    assert value(text, "t_seconds_bucket", le="+Inf") == 4
    assert value(text, "t_seconds_count") == 4
    assert value(text, "t_seconds_sum") == pytest.approx(20.65)
