"""The ``wakeful`` CLI against a running worker, on both backends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from entities import registry
from runtime import Runtime, Settings

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


def wakeful(server_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args, "--redis", server_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def run(server_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(wakeful, server_url, prefix, *args)


@pytest.fixture
async def worker(server_url: str, prefix: str):
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4, lease_ttl_ms=1000)
    rt = Runtime(registry, settings=settings, run_worker=True)
    await rt.start()
    yield rt
    await rt.close()


async def test_send_inspect_ls_and_tail(worker, server_url, prefix):
    sent = await run(server_url, prefix, "send", "/notes/cli", "add write tests", "--json")
    assert sent.returncode == 0, sent.stderr
    event_id = json.loads(sent.stdout)["event_id"]
    await worker.wait_idle("/notes/cli")

    inspected = await run(server_url, prefix, "inspect", "/notes/cli", "--json")
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert info["status"] == "idle" and info["type"] == "notes"
    assert info["state"]["notes"] == [{"id": 1, "text": "write tests", "done": False}]
    assert info["children"] == [] and info["pending_actions"] == []

    listed = await run(server_url, prefix, "ls", "notes")
    assert listed.stdout.split() == ["/notes/cli"]

    tail = await run(server_url, prefix, "tail", "/notes/cli")
    assert tail.returncode == 0
    lines = tail.stdout.splitlines()
    assert any(line.startswith(event_id) and "msg" in line for line in lines)
    assert any("state" in line for line in lines)


async def test_errors_are_reported_with_exit_code_1(worker, server_url, prefix):
    bad_url = await run(server_url, prefix, "send", "notes/x", "hi")
    assert bad_url.returncode == 1
    assert "error: invalid entity url 'notes/x': must start with '/'" in bad_url.stderr
    unknown = await run(server_url, prefix, "send", "/nobody/x", "hi")
    assert unknown.returncode == 1 and "unknown entity type 'nobody'" in unknown.stderr
    missing = await run(server_url, prefix, "inspect", "/notes/none")
    assert missing.returncode == 1 and "entity /notes/none does not exist" in missing.stderr
    await worker.send("/notes/ok", "add x")
    await worker.wait_idle("/notes/ok")
    not_failed = await run(server_url, prefix, "resume", "/notes/ok")
    assert not_failed.returncode == 1 and "is not failed" in not_failed.stderr
    usage = await run(server_url, prefix, "frobnicate")
    assert usage.returncode == 2


def test_serve_answers_http_on_the_embedded_default():
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "WAKEFUL_REDIS_URL"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            "serve",
            "entities:registry",
            "--port",
            str(port),
            "--token",
            "alice=secret",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(base + "/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        auth = {"authorization": "Bearer secret"}
        assert httpx.get(base + "/manifest").status_code == 401
        sent = httpx.post(
            base + "/entities/notes/n1/messages", json={"payload": "add milk"}, headers=auth
        )
        assert sent.status_code == 202
        for _ in range(100):
            state = httpx.get(base + "/entities/notes/n1/state", headers=auth).json()
            if state.get("notes"):
                break
            time.sleep(0.05)
        assert state["notes"] == [{"id": 1, "text": "milk", "done": False}]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
