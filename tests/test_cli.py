"""The ``wakeful`` CLI against a running worker, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.apps.harness import serving_embedded
from tests.terminals import on_a_terminal
from wakeful import HandlerContext, Registry, Runtime, ScriptedModel, Settings
from wakeful.entities import assistant, notes
from wakeful.events import ToolOutcome
from wakeful.models import ModelError

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


def cli_env(prefix: str, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess on the test's keyspace."""
    return {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4", **extra}


def wakeful(server_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(prefix)
    return subprocess.run(
        [sys.executable, "-m", "wakeful.cli", *args, "--redis", server_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def run(server_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(wakeful, server_url, prefix, *args)


def worker_registry() -> Registry:
    """The ready entity types, plus one whose runs fail and one that takes its time."""
    registry = Registry()
    notes.register(registry)
    assistant.register(registry)

    def refuse(request: object) -> None:
        raise ModelError("the model is down", retryable=False, model="broken")

    @registry.entity("broken")
    async def broken(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="", model=ScriptedModel(refuse), tools=[])
        await ctx.agent.run()

    for name, stop_reason in (("cutoff", "max_tokens"), ("refuser", "refusal")):

        def ended(request: object, stop_reason: str = stop_reason) -> object:
            return ScriptedModel.text("Half an", stop_reason=stop_reason)

        @registry.entity(name)
        async def stopped(ctx: HandlerContext, ended: Any = ended) -> None:
            ctx.use_agent(system_prompt="", model=ScriptedModel(ended), tools=[])
            await ctx.agent.run()

    @registry.entity("fragile")
    async def fragile(ctx: HandlerContext) -> None:
        if any(m.payload == "boom" for m in ctx.wake.messages):
            raise RuntimeError("boom")

    @registry.entity("failer")
    async def failer(ctx: HandlerContext) -> None:
        if any(m.payload == "bad" for m in ctx.wake.messages):
            raise RuntimeError("bad input")

    @registry.entity("slow")
    async def slow(ctx: HandlerContext) -> None:
        await asyncio.sleep(3)

    return registry


@pytest.fixture
async def worker(server_url: str, prefix: str):
    settings = Settings(
        redis_url=server_url,
        prefix=prefix,
        partitions=4,
        lease_ttl_ms=1000,
        max_attempts=2,
        retry_base_ms=20,
    )
    rt = Runtime(worker_registry(), settings=settings, run_worker=True)
    await rt.start()
    yield rt
    await rt.close()


async def test_inspect_shows_the_status_of_an_entity_whose_log_is_damaged(
    worker, server_url, prefix
):
    """An entry written into the log by hand that no one can decode: the worker parks
    the entity on it, and ``inspect`` shows that status and why the state cannot be
    read, instead of only the decoder's error."""
    await worker.send("/notes/dmg", "add one")
    await worker.wait_idle("/notes/dmg")
    await worker.store.redis.xadd(worker.store.keys.log("/notes/dmg"), {"x": "1"})
    await worker.send("/notes/dmg", "add two")
    assert (await worker.wait_idle("/notes/dmg")).status == "failed"

    inspected = await run(server_url, prefix, "inspect", "/notes/dmg", "--json")
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert info["status"] == "failed" and "could not be decoded" in info["error"]
    assert "could not be decoded" in info["state_unreadable"]
    table = await run(server_url, prefix, "inspect", "/notes/dmg")
    assert table.returncode == 0, table.stderr
    assert "failed" in table.stdout and "state_unreadable" in table.stdout


async def test_send_inspect_ls_and_tail(worker, server_url, prefix):
    sent = await run(server_url, prefix, "send", "/notes/cli", "add write tests", "--json")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["event_id"].count("-") == 1  # a stream id
    await worker.wait_idle("/notes/cli")

    inspected = await run(server_url, prefix, "inspect", "/notes/cli", "--json")
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert info["status"] == "idle" and info["type"] == "notes"
    assert info["state"]["notes"] == [{"id": 1, "text": "write tests", "done": False}]
    assert info["children"] == [] and info["pending_actions"] == []
    assert info["lease_owner"].startswith(worker.worker.id)
    assert info["lag"] == {"inputs": 0, "oldest_ms": 0}
    table = await run(server_url, prefix, "inspect", "/notes/cli")
    assert "lease_owner" in table.stdout and "write tests" in table.stdout

    listed = await run(server_url, prefix, "ls", "notes")
    assert listed.stdout.splitlines() == ["/notes/cli\tidle"]
    everything = await run(server_url, prefix, "ls", "--json")
    assert json.loads(everything.stdout) == [
        {"url": "/notes/cli", "status": "idle", "pending_actions": 0}
    ]

    tail = await run(server_url, prefix, "tail", "/notes/cli")
    assert tail.returncode == 0
    lines = tail.stdout.splitlines()
    assert any("message" in line and "from a client: add write tests" in line for line in lines)
    assert any("state" in line and "insert notes[1]" in line for line in lines)


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
    bad_identity = await run(server_url, prefix, "send", "/notes/ok", "x", "--identity", "alice")
    assert bad_identity.returncode == 1 and "must be KEY=VALUE" in bad_identity.stderr


async def test_resume_a_parked_entity(worker, server_url, prefix):
    await worker.send("/fragile/f1", "boom")
    assert (await worker.wait_idle("/fragile/f1")).status == "failed"
    inspected = json.loads(
        (await run(server_url, prefix, "inspect", "/fragile/f1", "--json")).stdout
    )
    assert inspected["status"] == "failed" and "boom" in inspected["error"]
    resumed = await run(server_url, prefix, "resume", "/fragile/f1", "--skip-failed")
    assert resumed.returncode == 0 and "resumed /fragile/f1" in resumed.stdout
    assert (await worker.wait_idle("/fragile/f1")).status == "idle"


async def test_compact_and_reset_a_conversation(worker, server_url, prefix):
    url = "/assistant/compacted"
    for question in ("calculate 1 + 1", "calculate 2 + 2", "calculate 3 + 3"):
        await worker.ask(url, question)
    compacted = await run(server_url, prefix, "compact", url)
    assert compacted.returncode == 0, compacted.stderr
    assert compacted.stdout.strip() == f"compacted the conversation of {url}"
    first = (await worker.conversation(url))[0]["content"][0]["text"]
    assert first.startswith("[Summary of the earlier conversation]") and "1 + 1" in first
    reset = await run(server_url, prefix, "reset", url, "--json")
    assert json.loads(reset.stdout) == {"url": url, "reset": True}
    assert await worker.conversation(url) == []
    again = await run(server_url, prefix, "reset", url)
    assert again.stdout.strip() == f"nothing to reset in the conversation of {url}"


async def test_resume_skip_failed_prints_exactly_the_skipped_inputs(server_url, prefix):
    settings = Settings(
        redis_url=server_url, prefix=prefix, partitions=4, max_attempts=2, retry_base_ms=20
    )
    client = Runtime(worker_registry(), settings=settings, run_worker=False)
    await client.start()
    worker = Runtime(worker_registry(), settings=settings, run_worker=True)
    try:
        # Sent before the worker runs: "bad" and "good" are one wake.
        await client.send("/failer/f1", "hello")
        bad = await client.send("/failer/f1", "bad")
        good = await client.send("/failer/f1", "good")
        await worker.start()
        assert (await worker.wait_idle("/failer/f1")).status == "failed"
        resumed = await run(server_url, prefix, "resume", "/failer/f1", "--skip-failed")
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.splitlines() == ["resumed /failer/f1", f"skipped {bad}"]
        status = await worker.wait_idle("/failer/f1")
        assert status.status == "idle" and status.cursor == good  # "good" was handled
    finally:
        await worker.close()
        await client.close()


def test_unreachable_redis_exits_6(prefix):
    result = wakeful("redis://127.0.0.1:1/0", prefix, "ls", "notes")
    assert result.returncode == 6
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["send", "/notes/x", "hi"],
        # A worker waits for a Redis that does not answer yet, but no wait fixes
        # refused credentials: it must not wait forever saying "cannot reach Redis".
        ["worker", "tests.apps.quiet:registry"],
    ],
    ids=["send", "worker"],
)
def test_wrong_redis_credentials_are_refused_not_unreachable(real_redis_url, prefix, command):
    """Redis answered: a user name or password it refuses is exit 1, not 6 (unreachable),
    the password redacted. A real Redis: the fake one takes any credentials."""
    address = urlsplit(real_redis_url).netloc.rpartition("@")[2]
    wrong = urlsplit(real_redis_url)._replace(netloc=f"nobody:pw-{prefix}@{address}")
    result = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", *command],
        cwd=ROOT,
        env=cli_env(prefix, WAKEFUL_REDIS_URL=urlunsplit(wrong)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    shown = urlunsplit(wrong._replace(netloc=f"nobody:***@{address}"))
    assert f"error: Redis refused the credentials of {shown}: " in result.stderr
    assert f"pw-{prefix}" not in result.stderr


def test_help_lists_every_exit_code():
    from wakeful import cli_parser

    codes = {v for k, v in vars(cli_parser).items() if k.isupper() and isinstance(v, int)}
    epilog = " ".join(cli_parser.build_parser().format_help().split("exit codes:")[1].split())
    assert codes and all(f" {code} " in f" {epilog}" for code in codes), epilog


async def test_ask_streams_the_reply(worker, server_url, prefix):
    asked = await run(server_url, prefix, "ask", "/assistant/a1", "remember that my color is teal")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == "Got it: I'll remember that your color is teal.\n"
    assert "⚙ memory" in asked.stderr and "✓ Remembered 'color'." in asked.stderr
    # A delegated question: ask waits for the child and streams the answer that follows.
    research = await run(server_url, prefix, "ask", "/assistant/a1", "research what 6 * 7 is")
    assert research.returncode == 0, research.stderr
    assert "I'll delegate that." in research.stdout
    assert "The researcher reports back: Findings: 6 * 7 = 42" in research.stdout
    assert "↩ /researcher/" in research.stderr
    as_json = await run(server_url, prefix, "ask", "/assistant/a1", "what is my color?", "--json")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["status"] == "completed" and result["response"] == "Your color is teal."


async def test_ask_exit_codes_for_failed_and_slow_runs(worker, server_url, prefix):
    failed = await run(server_url, prefix, "ask", "/broken/b1", "hello")
    assert failed.returncode == 3
    assert "the model is down" in failed.stderr
    slow = await run(server_url, prefix, "ask", "/slow/s1", "hello", "--timeout", "0.5")
    assert slow.returncode == 5 and "timed out: /slow/s1 is still" in slow.stderr


async def test_ask_exit_codes_for_truncated_and_refused_runs(worker, server_url, prefix):
    cut = await run(server_url, prefix, "ask", "/cutoff/c1", "hello")
    assert cut.returncode == 7, cut.stderr
    assert "Half an" in cut.stdout and "truncated" in cut.stderr
    assert "output limit of 4096 tokens" in cut.stderr
    refused = await run(server_url, prefix, "ask", "/refuser/r1", "hello", "--json")
    assert refused.returncode == 8, refused.stderr
    result = json.loads(refused.stdout)
    assert (result["status"], result["stop_reason"]) == ("refused", "refusal")
    assert result["response"] == "Half an"


async def test_pending_approve_and_deny(worker, server_url, prefix):
    await worker.ask("/assistant/p1", "remember that my city is Lyon")
    await worker.ask("/assistant/p1", "remember that my pet is a cat")
    suspended = await run(
        server_url, prefix, "ask", "/assistant/p1", "forget my city", "--no-input"
    )
    assert suspended.returncode == 4
    assert "waits for approval" in suspended.stderr
    assert "wakeful approve /assistant/p1" in suspended.stderr

    pending = await run(server_url, prefix, "pending", "/assistant/p1", "--json")
    assert pending.returncode == 0
    [action] = json.loads(pending.stdout)
    assert action["tool"] == "memory" and action["kind"] == "approval"
    assert action["input"] == {"action": "delete", "key": "city"}
    table = await run(server_url, prefix, "pending", "/assistant/p1")
    assert action["tool_call_id"] in table.stdout
    # One word for a run waiting on an approval, in the client, `inspect` and `ls`.
    assert (await worker.status("/assistant/p1")).status == "suspended"
    info = json.loads((await run(server_url, prefix, "inspect", "/assistant/p1", "--json")).stdout)
    assert info["status"] == "suspended"
    assert (info["run"]["id"], info["run"]["status"]) == (action["run_id"], "suspended")
    assert info["last_run"]["status"] == "completed"
    listed = await run(server_url, prefix, "ls", "assistant")
    assert "/assistant/p1\tsuspended" in listed.stdout.splitlines()
    table = (await run(server_url, prefix, "inspect", "/assistant/p1")).stdout
    assert f"{action['run_id']} suspended" in table and "suspended" in table

    approved = await run(
        server_url, prefix, "approve", "/assistant/p1", action["tool_call_id"], "--follow"
    )
    assert approved.returncode == 0, approved.stderr
    assert "Forgot 'city'." in approved.stdout
    again = await run(server_url, prefix, "approve", "/assistant/p1", action["tool_call_id"])
    assert again.returncode == 1 and "no pending action" in again.stderr

    await run(server_url, prefix, "ask", "/assistant/p1", "forget my pet", "--no-input")
    [action] = await worker.pending_actions("/assistant/p1")
    denied = await run(
        server_url, prefix, "deny", "/assistant/p1", action.tool_call_id, "--reason", "keep it"
    )
    assert denied.returncode == 0 and "denied" in denied.stdout
    await worker.wait_idle("/assistant/p1")
    assert await worker.pending_actions("/assistant/p1") == []
    assert (await worker.state("/assistant/p1"))["kv"] == [{"key": "pet", "value": "a cat"}]
    none = await run(server_url, prefix, "pending", "/assistant/p1")
    assert "has no pending actions" in none.stdout


async def test_set_data_and_skip_a_pending_call_from_the_command_line(worker, server_url, prefix):
    await worker.ask("/assistant/k1", "remember that my city is Lyon")
    await run(server_url, prefix, "ask", "/assistant/k1", "forget my city", "--no-input")
    [action] = await worker.pending_actions("/assistant/k1")
    data = await run(
        server_url, prefix, "set-data", "/assistant/k1", action.tool_call_id, '{"seen": true}'
    )
    assert data.returncode == 0, data.stderr
    assert await worker.tool_data("/assistant/k1") == {action.tool_call_id: {"seen": True}}
    bad = await run(server_url, prefix, "set-data", "/assistant/k1", action.tool_call_id, "{")
    assert bad.returncode != 0 and "not JSON" in bad.stderr
    skipped = await run(
        server_url, prefix, "skip", "/assistant/k1", action.tool_call_id, "--reason", "not now"
    )
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped" in skipped.stdout
    await worker.wait_idle("/assistant/k1")
    assert await worker.pending_actions("/assistant/k1") == []
    assert (await worker.state("/assistant/k1"))["kv"] == [{"key": "city", "value": "Lyon"}]
    [result] = [
        e
        for e in await worker.history("/assistant/k1")
        if isinstance(e, ToolOutcome) and e.tool_call_id == action.tool_call_id
    ]
    assert not result.is_error and result.details["output"]["reason"] == "not now"


async def test_set_data_acts_as_the_identity_given(worker, server_url, prefix):
    """alice's run: set-data needs her identity, as approve and deny do."""
    alice = {"user": "alice"}
    await worker.ask("/assistant/k2", "remember that my city is Lyon", identity=alice)
    await worker.send("/assistant/k2", "forget my city", identity=alice)
    assert (await worker.wait_idle("/assistant/k2")).status == "suspended"
    [action] = await worker.pending_actions("/assistant/k2")
    data = ("set-data", "/assistant/k2", action.tool_call_id, '{"seen": true}')
    anonymous = await run(server_url, prefix, *data)
    assert anonymous.returncode == 1 and "may not set the tool data" in anonymous.stderr
    # It says who asked, and how to answer as the run's identity.
    assert "a caller without an identity may not" in anonymous.stderr
    assert "--identity KEY=VALUE" in anonymous.stderr
    approving = await run(server_url, prefix, "approve", "/assistant/k2", action.tool_call_id)
    assert approving.returncode == 1 and "a caller without an identity may not answer" in (
        approving.stderr
    )
    assert "--identity KEY=VALUE" in approving.stderr
    as_alice = await run(server_url, prefix, *data, "--identity", "user=alice")
    assert as_alice.returncode == 0, as_alice.stderr
    assert await worker.tool_data("/assistant/k2") == {action.tool_call_id: {"seen": True}}


async def test_export_to_a_path_it_cannot_write_is_an_error(worker, server_url, prefix, tmp_path):
    await worker.send("/notes/e1", "add x")
    await worker.wait_idle("/notes/e1")
    for path, reason in (
        (tmp_path, "Is a directory"),
        (tmp_path / "missing" / "x.jsonl", "No such file or directory"),
        (Path("/dev/full"), "No space left on device"),  # it opens; writing fails
    ):
        exported = await run(server_url, prefix, "export", "/notes/e1", "-o", str(path))
        assert exported.returncode == 1, exported.stderr
        assert exported.stderr == f"error: cannot write {path}: {reason}\n"


async def test_a_full_standard_output_is_an_error_not_a_traceback(worker, server_url, prefix):
    """stdout on a full disk: every command that prints says so in one line, exit 1
    (a closed pipe stays exit 141, tested with ``| head``)."""
    await worker.send("/notes/e2", "add x")
    await worker.wait_idle("/notes/e2")
    for command in (["export"], ["tail"], ["tail", "--json"], ["inspect"]):
        with open("/dev/full", "w") as full:
            printed = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "wakeful.cli", *command, "/notes/e2"],
                cwd=ROOT,
                env={**cli_env(prefix), "WAKEFUL_REDIS_URL": server_url},
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        assert printed.returncode == 1, (command, printed.stderr)
        said = "error: cannot write to standard output: No space left on device\n"
        assert printed.stderr == said, (command, printed.stderr)


async def test_tail_json_and_resume(worker, server_url, prefix):
    await worker.ask("/assistant/t1", "calculate 2 * 21")
    whole = await run(server_url, prefix, "tail", "/assistant/t1", "--json")
    records = [json.loads(line) for line in whole.stdout.splitlines()]
    kinds = [r["event"]["t"] for r in records]
    assert (
        kinds[:2] == ["created", "msg"] and "tool_result" in kinds and kinds[-1] == "run_finished"
    )
    resumed = await run(
        server_url, prefix, "tail", "/assistant/t1", "--json", "--after", records[2]["id"]
    )
    assert [json.loads(line) for line in resumed.stdout.splitlines()] == records[3:]


def test_serve_answers_http_on_the_embedded_default():
    import time

    import httpx

    with serving_embedded("--token", "alice=secret") as (_, base):
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


def test_serve_on_a_port_in_use_fails_before_its_banner():
    env = {k: v for k, v in os.environ.items() if k != "WAKEFUL_REDIS_URL"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = ["serve", "wakeful.entities:registry", "--port", str(port)]
        served = subprocess.run(
            [sys.executable, "-m", "wakeful.cli", *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert served.returncode == 1, served.stderr
    assert served.stdout == ""  # no banner: nothing was served
    assert (
        served.stderr
        == f"error: --port {port}: cannot listen on 127.0.0.1: port {port} is in use\n"
    )


async def test_ask_prompts_for_approval_on_a_terminal(worker, server_url, prefix):
    await worker.ask("/assistant/i1", "remember that my city is Lyon")
    env = cli_env(prefix, TERM="xterm")
    command = [sys.executable, "-m", "wakeful.cli", "ask", "/assistant/i1", "forget my city"]
    code, output = await asyncio.to_thread(
        on_a_terminal, [*command, "--redis", server_url], env, "approve", "y\n"
    )
    assert code == 0, output
    assert "[y/n]" in output  # the hint, not eaten as a markup tag
    assert "Forgot 'city'." in output
    assert (await worker.state("/assistant/i1"))["kv"] == []


async def test_ask_prompts_for_no_call_of_another_identitys_run(worker, server_url, prefix):
    """bob's message waits for alice's suspended run: his `ask` does not offer him her
    call to approve, and ends as suspended."""
    alice = {"user": "alice"}
    await worker.ask("/assistant/i3", "remember that my city is Lyon", identity=alice)
    await worker.send("/assistant/i3", "forget my city", identity=alice)
    assert (await worker.wait_idle("/assistant/i3")).status == "suspended"
    env = cli_env(prefix, TERM="xterm")
    command = [sys.executable, "-m", "wakeful.cli", "ask", "/assistant/i3", "forget my city"]
    code, output = await asyncio.to_thread(
        on_a_terminal,
        [*command, "--identity", "user=bob", "--redis", server_url],
        env,
        ")?",
        "y\n",
    )
    assert code == 4, output
    assert "[answered: False]" in output
    [action] = await worker.pending_actions("/assistant/i3")
    assert action.authorized == alice


async def test_ctrl_c_at_the_approval_prompt_exits_130(worker, server_url, prefix):
    import signal

    await worker.ask("/assistant/i2", "remember that my city is Lyon")
    env = cli_env(prefix, TERM="xterm")
    command = [sys.executable, "-m", "wakeful.cli", "ask", "/assistant/i2", "forget my city"]
    # The prompt itself ("approve memory {...} (<call id>)?"), not the earlier "waits for
    # approval" line: Ctrl-C while the prompt waits for an answer.
    code, output = await asyncio.to_thread(
        on_a_terminal, [*command, "--redis", server_url], env, ")?", signal.SIGINT
    )
    assert code == 130, output
    # Nothing was answered: the call still waits.
    [action] = await worker.pending_actions("/assistant/i2")
    assert action.input == {"action": "delete", "key": "city"}


def test_ctrl_c_on_a_terminal_reaches_the_command_when_the_suite_ignores_it():
    """A suite started in the background by a script (`nohup run.sh &`: no job control)
    runs with SIGINT ignored, and a command inherits an ignored signal: Python keeps
    ignoring it and asyncio installs no Ctrl-C handler, so `wakeful ask` at its prompt
    and `wakeful tail -f` never stopped (the Ctrl-C tests hung, whatever the load). The
    terminal helper runs a command as an interactive shell does, SIGINT at its default."""
    import signal

    # What asyncio.run does on Ctrl-C: the main task cancelled, then KeyboardInterrupt,
    # which kills the process with SIGINT. Ignored, the sleep ends with exit code 0.
    # 'ready' is printed from the running task: Python 3.11's asyncio.Runner zeroes its
    # interrupt count after installing its SIGINT handler, so a Ctrl-C in between
    # (printed before asyncio.run, a clean run once failed so) ends in CancelledError.
    command = [
        sys.executable,
        "-c",
        "import asyncio\n"
        "async def main():\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(15)\n"
        "asyncio.run(main())",
    ]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `nohup run.sh &`
    try:
        code, output = on_a_terminal(command, dict(os.environ), "ready", signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == -signal.SIGINT, output


async def test_a_ctrl_c_just_before_the_prompt_is_not_lost(monkeypatch):
    """A Ctrl-C that lands after the last await but before the prompt waits only asked
    asyncio to cancel the task: the prompt must not wait for input then."""
    from wakeful.cli_reply import PromptInterrupted, _confirm

    read_end, write_end = os.pipe()  # a terminal on which nothing is ever typed
    monkeypatch.setattr(sys, "stdin", open(read_end, closefd=False))  # noqa: SIM115
    task = asyncio.current_task()
    assert task is not None
    task.cancel()  # what asyncio's SIGINT handler does
    try:
        with pytest.raises(PromptInterrupted):
            await _confirm("approve?")
        assert not task.cancelling()  # the interruption is the answer: teardown runs
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_a_ctrl_c_swallowed_before_the_prompt_still_ends_it(monkeypatch):
    """Python 3.11's asyncio.wait_for (redis-py's socket writes) returns its future's
    result when the cancel comes as the future completes: the Ctrl-C is then only a
    pending cancellation (``cancelling()``) that nothing raises. The prompt must end on
    it, not wait for an answer that never comes."""
    from wakeful.cli_reply import PromptInterrupted, _confirm

    read_end, write_end = os.pipe()  # a terminal on which nothing is ever typed
    monkeypatch.setattr(sys, "stdin", open(read_end, closefd=False))  # noqa: SIM115

    async def approving() -> bool:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # Ctrl-C (asyncio's SIGINT handler), during a Redis call before
        with contextlib.suppress(asyncio.CancelledError):  # which swallows it
            await asyncio.sleep(0)
        assert task.cancelling() == 1
        return await _confirm("approve?")

    prompt = asyncio.create_task(approving())
    try:
        done, _ = await asyncio.wait({prompt}, timeout=5)
        assert prompt in done, "the prompt waited for an answer after Ctrl-C"
        assert isinstance(prompt.exception(), PromptInterrupted)
        assert not prompt.cancelling()  # the interruption is the answer: teardown runs
    finally:
        prompt.cancel()
        os.close(read_end)
        os.close(write_end)


async def test_ask_streams_on_a_terminal(worker, server_url, prefix):
    env = cli_env(prefix, TERM="xterm")
    command = [sys.executable, "-m", "wakeful.cli", "ask", "/assistant/i3", "calculate 6 * 7"]
    code, output = await asyncio.to_thread(
        on_a_terminal, [*command, "--redis", server_url], env, "never shown", ""
    )
    assert code == 0, output
    assert output.count("42") >= 1 and "⚙ calculator" in output


@pytest.mark.parametrize("after", ["99999999999999999999-0", "1-99999999999999999999"])
async def test_tail_after_an_id_past_64_bits_is_named_not_refused_by_redis(
    worker, server_url, prefix, after
):
    await run(server_url, prefix, "send", "/notes/big-after", "add milk")
    result = await run(server_url, prefix, "tail", "/notes/big-after", "--after", after)
    assert result.returncode == 1, result.stderr
    assert (
        result.stderr.strip()
        == f"error: --after {after!r} is not an event id (like 1700000000000-0)"
    )


def test_an_identity_key_given_twice_is_refused_before_anything_is_sent(server_url, prefix):
    """``--identity user=alice --identity user=bob`` acted as bob, silently."""
    args = ["--identity", "user=alice", "--identity", "user=bob"]
    for command in (["send", "/notes/x", "hi"], ["approve", "/notes/x", "call-1"]):
        result = wakeful(server_url, prefix, *command, *args)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip() == (
            "error: --identity gives 'user' twice ('alice' and 'bob'): give it once"
        )


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon"])
@pytest.mark.parametrize(
    "command",
    [
        ["ask", "/notes/t", "hi"],
        ["delete", "/notes/t"],
        ["compact", "/notes/t"],
        ["approve", "/notes/t", "call-1", "--follow"],
    ],
)
def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(prefix, command, value):
    """``--timeout nan`` was taken by float() and the wait never ended (no deadline
    compares past NaN); a negative one timed out at once ("within -1.0s")."""
    unreachable = "redis://127.0.0.1:1/0"  # refused before it would connect
    result = wakeful(unreachable, prefix, *command, "--timeout", value)
    assert result.returncode == 2, result.stderr
    assert f"argument --timeout: {value!r} is not a number of seconds" in result.stderr
    assert "Traceback" not in result.stderr


async def test_control_characters_of_a_message_never_reach_the_terminal(worker, server_url, prefix):
    """A message is untrusted (any HTTP client's): printed as it was, its escape
    sequences retitled, cleared or rewrote the operator's terminal."""
    hostile = "add \x1b]0;pwned\x07 \x1b[2J\x9bx"
    sent = await run(server_url, prefix, "send", "/notes/esc", hostile)
    assert sent.returncode == 0, sent.stderr
    await worker.wait_idle("/notes/esc", timeout=20)
    for command in ("tail", "state"):
        shown = await run(server_url, prefix, command, "/notes/esc")
        assert shown.returncode == 0, shown.stderr
        assert "\\x1b]0;pwned" in shown.stdout and "\\x1b[2J\\x9bx" in shown.stdout
        assert not any(c in shown.stdout for c in "\x1b\x07\x9b"), shown.stdout


async def test_bad_arguments_are_named(worker, server_url, prefix):
    bad_after = await run(server_url, prefix, "tail", "/notes/x", "--after", "abc")
    assert bad_after.returncode == 1 and "--after 'abc' is not an event id" in bad_after.stderr
    bad_redis = wakeful("localhost:6379", prefix, "ls")
    assert bad_redis.returncode == 1 and "must start with redis://" in bad_redis.stderr
    assert "Traceback" not in bad_after.stderr + bad_redis.stderr


async def test_tail_follows_live_output(worker, server_url, prefix):
    env = cli_env(prefix)
    await worker.ask("/assistant/l1", "hello")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakeful.cli",
            "tail",
            "/assistant/l1",
            "-f",
            "--live",
            "--json",
            "--redis",
            server_url,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        records = []
        caught_up = threading.Event()  # tail printed the first run: its live position is set

        def read_until_second_run() -> None:
            finished = 0
            for line in proc.stdout:  # type: ignore[union-attr]
                records.append(json.loads(line))
                if records[-1].get("event", {}).get("t") == "run_finished":
                    finished += 1
                    caught_up.set()
                    if finished == 2:
                        return

        reader = asyncio.create_task(asyncio.to_thread(read_until_second_run))
        # tail takes the live position before it reads the log: once it printed the first
        # run, every delta of the next one reaches it.
        assert await asyncio.to_thread(caught_up.wait, 30), "tail never printed the first run"
        await worker.send("/assistant/l1", "calculate 2 + 2")
        await asyncio.wait_for(reader, 30)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    live = [r["live"] for r in records if "live" in r]
    assert any(e["kind"] == "text" and "4" in e["data"] for e in live)
    assert any(e["kind"] == "text" and e.get("step") for e in live)


async def test_a_closed_pipe_ends_tail_quietly(worker, server_url, prefix):
    for n in range(120):
        await worker.send("/notes/pipe", f"add item {n}")
    await worker.wait_idle("/notes/pipe")
    env = cli_env(prefix)
    # A pipe smaller than what tail prints (about 11 KB), read one byte at a time: tail
    # must still be writing when the reader goes, however slow the reader is (a loaded
    # machine let tail write everything into a 64 KB pipe and exit 0 before the close).
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen(
        [sys.executable, "-m", "wakeful.cli", "tail", "/notes/pipe", "--redis", server_url],
        cwd=ROOT,
        env=env,
        stdout=write_end,
        stderr=subprocess.PIPE,
    )
    os.close(write_end)
    assert proc.stderr is not None
    with open(read_end, "rb", buffering=0) as reader:
        first = reader.readline()  # like `wakeful tail URL | head -1`
    code = await asyncio.to_thread(proc.wait, 30)
    stderr = proc.stderr.read().decode()
    assert b"created" in first
    assert code == 141 and "Traceback" not in stderr, stderr


def test_an_app_in_the_current_directory_is_found(tmp_path):
    (tmp_path / "myapp.py").write_text(
        "from wakeful import Registry\n"
        "registry = Registry()\n\n"
        "@registry.entity('greeter')\n"
        "async def greeter(ctx):\n"
        "    pass\n"
    )
    # The console script, not `python -m` (which puts the current directory on the path).
    script = Path(sys.executable).parent / "wakeful"
    result = subprocess.run(
        [str(script), "manifest", "myapp", "--json"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert [t["name"] for t in json.loads(result.stdout)["types"]] == ["greeter"]
