"""``wakeful demo`` end to end, as a new user runs it: a subprocess, no network, no API key.

The demo starts worker processes, kills one with ``kill -9`` while the agent
waits for a model step, and resumes the run on another. The demo runs once per
module; the tests read its output, then run the commands it prints at the end.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import REAL_REDIS_URL
from wakeful.embedded import SharedEmbedded
from wakeful.entities import demo_next

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PATH": "/usr/bin:/bin"}  # no key, no WAKEFUL_* settings, the venv not on PATH


@pytest.fixture(scope="module")
def demo_out() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=ENV,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _pid(out: str, name: str) -> int:
    found = re.search(rf"Worker {name} is up: pid (\d+), worker id \S+-\1-", out)
    assert found, f"worker {name} did not start:\n{out}"
    return int(found.group(1))


def test_the_demo_kills_a_worker_mid_run_and_another_process_resumes_it(demo_out: str) -> None:
    a, b = _pid(demo_out, "A"), _pid(demo_out, "B")
    assert a != b
    killed = demo_out.index(f"kill -9 {a}: worker A dies mid-run")
    # A had journaled the tool call (and the step asking for it) when it was killed.
    assert "Journaled before the crash: 1 model step and 1 tool result." in demo_out
    assert demo_out.index("memory {") < killed
    b_up = demo_out.index(f"Worker B is up: pid {b}")
    countdown = re.search(  # a loaded machine may start B after the lease lapsed
        r"waiting for the dead worker's lease to lapse:"
        r"(( \d+ s)+ - lapsed\.| it had lapsed while worker B started\.)",
        demo_out,
    )
    assert countdown and countdown.start() > b_up > killed
    resumed = demo_out.index("Got it: I'll remember that your favourite colour is teal.")
    assert resumed > countdown.start()
    # The log holds the journaled call and its result once: B did not run it again.
    assert demo_out.count('memory {"action": "set"') == 1
    assert demo_out.count("Remembered 'favourite colour'.") == 1


def test_the_new_worker_asks_the_model_only_for_the_steps_not_journaled(demo_out: str) -> None:
    a, b = _pid(demo_out, "A"), _pid(demo_out, "B")
    flat = " ".join(demo_out.split())  # the demo wraps its sentences
    found = re.search(
        rf"worker A \(pid {a}\) made (\d+), (\d+) of them never answered \(it was killed "
        rf"waiting\); worker B \(pid {b}\) made (\d+)\.",
        flat,
    )
    assert found, demo_out
    by_a, lost, by_b = map(int, found.groups())
    assert lost == 1 and by_a >= 2  # A asked for the step it journaled, then for the lost one
    assert "(run finished: completed, 2 model steps, 1 tool call)" in demo_out
    proof = re.search(
        r"model calls by the new worker: (\d+) = (\d+) steps - (\d+) journaled before the "
        r"crash: no journaled step was asked again\.",
        flat,
    )
    assert proof, demo_out
    new, steps, journaled = map(int, proof.groups())
    assert new == by_b == steps - journaled
    assert journaled >= 1 and new >= 1


def test_the_demo_tells_the_rest_of_the_story(demo_out: str) -> None:
    """The notes entity before and after the crash, the agent's memory, a child's run."""
    assert "[ ] 4. book flights" in demo_out
    assert "'fly to the moon': unknown command" in demo_out
    assert "A snapshot of the state was written" in demo_out
    assert "Model: ScriptedModel (no ANTHROPIC_API_KEY" in demo_out
    assert "Your favourite colour is teal." in demo_out
    assert "| meanwhile /researcher/researcher-" in demo_out
    assert 'calculator {"expression": "149597870.7 / 299792.458 / 60"}' in demo_out
    assert "The researcher reports back: Findings: 149597870.7 / 299792.458 / 60 =" in demo_out
    assert "favourite colour = teal" in demo_out
    assert "Worker B exited with code 0." in demo_out


# -- the commands it prints --------------------------------------------------------------


def _printed(out: str) -> dict[str, list[str]]:
    """The printed next-step commands, by their subcommand."""
    commands = [shlex.split(line[4:]) for line in out.splitlines() if line.startswith("  $ ")]
    return {words[1]: words for words in commands}


def test_the_printed_commands_name_the_installed_script(demo_out: str) -> None:
    printed = _printed(demo_out)
    assert set(printed) == {"serve", "worker", "ask", "tail", "--help"}
    for words in printed.values():
        assert words[0] == ".venv/bin/wakeful"  # `wakeful` is not on PATH after the set-up
    done = subprocess.run(printed["--help"], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0 and "worker" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _line(proc: asyncio.subprocess.Process, pattern: str, timeout: float = 60) -> str:
    """Read ``proc``'s stdout until a line matches ``pattern``."""
    assert proc.stdout is not None
    seen = []
    async with asyncio.timeout(timeout):
        while line := (await proc.stdout.readline()).decode():
            seen.append(line)
            if re.search(pattern, line):
                return line
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


async def _stop(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> int:
    if proc.returncode is None:
        proc.send_signal(sig)
    try:
        async with asyncio.timeout(30):
            return await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.anyio
async def test_the_printed_serve_command_serves_the_console(demo_out: str) -> None:
    """As printed, on another port (8000 may be taken on a shared machine)."""
    port = _free_port()
    words = [*_printed(demo_out)["serve"], "--port", str(port)]
    proc = await asyncio.create_subprocess_exec(
        *words, cwd=ROOT, env=ENV, stdout=asyncio.subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        await _line(proc, r"^serving .*console: ")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/console/")).status_code == 200
            assert (await http.get("/readyz")).status_code == 200
    finally:
        assert await _stop(proc, signal.SIGINT) in (0, 130)  # Ctrl-C, as printed


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    """A key prefix of its own on the Redis the printed commands name (deleted after)."""
    if REAL_REDIS_URL != demo_next.REDIS_HINT:
        pytest.skip(
            f"the printed commands name {demo_next.REDIS_HINT}, the tests' Redis is elsewhere"
        )
    redis = Redis.from_url(REAL_REDIS_URL)
    try:
        await redis.ping()
    except Exception:
        await redis.aclose()
        pytest.skip(f"no Redis at {REAL_REDIS_URL}")
    prefix = f"t{secrets.token_hex(4)}"
    try:
        yield prefix
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


@pytest.mark.anyio
async def test_the_printed_redis_commands_run_a_worker_and_talk_to_the_agent(
    demo_out: str, redis_prefix: str
) -> None:
    """Worker, ask and tail as printed, on the Redis they name (a prefix of the test's own)."""
    printed = _printed(demo_out)
    env = {**ENV, "WAKEFUL_PREFIX": redis_prefix}
    worker = await asyncio.create_subprocess_exec(
        *printed["worker"],
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        await _line(worker, r"^worker \S+ running ")
        for name, expected in (("ask", "teal"), ("tail", "favourite colour")):
            done = await asyncio.create_subprocess_exec(
                *printed[name],
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            async with asyncio.timeout(60):
                output, _ = await done.communicate()
            assert done.returncode == 0, output.decode()
            assert expected in output.decode()
    finally:
        assert await _stop(worker) == 0


# -- where the commands point ------------------------------------------------------------


@pytest.fixture
def venv_bin() -> Iterator[Path]:
    script = Path(sys.executable).parent / "wakeful"
    if not script.exists():
        pytest.skip("the wakeful script is not installed beside this Python")
    yield script.parent


def test_the_command_is_relative_below_the_current_directory(venv_bin, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    checkout = venv_bin.parent.parent
    monkeypatch.chdir(checkout)
    assert demo_next.wakeful_command() == str((venv_bin / "wakeful").relative_to(checkout))


def test_the_command_is_absolute_elsewhere_and_plain_when_on_path(
    venv_bin, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    assert demo_next.wakeful_command() == str((venv_bin / "wakeful").absolute())
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}/usr/bin:/bin")  # an activated venv
    assert demo_next.wakeful_command() == "wakeful"


# -- the shared embedded Redis --------------------------------------------------------


@pytest.mark.anyio
async def test_shared_embedded_redis_is_one_keyspace_for_every_client() -> None:
    with SharedEmbedded() as server:
        first, second = Redis.from_url(server.url), Redis.from_url(server.url)
        try:
            await first.set("k", "v")
            assert await second.get("k") == b"v"
        finally:
            await first.aclose()
            await second.aclose()
    with pytest.raises(ConnectionError):
        socket.create_connection(("127.0.0.1", int(server.address.rsplit(":", 1)[1])), 1)


def test_readme_shared_embedded_example_runs(capsys) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"To share it with worker processes.*?```python\n(.*?)```", readme, re.S)
    assert code, "the README's SharedEmbedded example"
    exec(compile(code.group(1), "README.md", "exec"), {"__name__": "__main__"})
    assert re.fullmatch(r"redis://127\.0\.0\.1:\d+/0\n", capsys.readouterr().out)
