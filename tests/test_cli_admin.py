"""The operator's commands: create, cancel, delete, state, history, submit, fail; and the
readable transcript of ``wakeful tail``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.test_cli import run
from wakeful import HandlerContext, Registry, Runtime, ScriptedModel, Settings
from wakeful.entities import notes
from wakeful.errors import EntityNotFoundError
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio

LOCATION = {
    "name": "getLocation",
    "description": "Where the user is",
    "input_schema": {"type": "object", "properties": {}},
    "output_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def locate(request: ModelRequest) -> Any:
    """Ask the client for the location; once answered, say what came back."""
    content = request.messages[-1]["content"]
    results = (
        [b for b in content if b.get("type") == "tool_result"] if isinstance(content, list) else []
    )
    if results:
        text = "".join(c.get("text", "") for c in results[0]["content"])
        return f"The client said: {text}"
    call = {"type": "tool_use", "id": "", "name": "getLocation", "input": {}}
    return ModelResponse(content=[call], stop_reason="tool_use")


def registry(thinking: asyncio.Event | None = None) -> Registry:
    """``thinking`` is set when the sleeper's model is asked (its run is open)."""
    reg = Registry()
    notes.register(reg)

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="", model=ScriptedModel(locate), tools=[])
        await ctx.agent.run()

    async def thinks_forever(request: ModelRequest) -> Any:
        if thinking is not None:
            thinking.set()
        await asyncio.Event().wait()  # until the run is cancelled

    @reg.entity("sleeper")
    async def sleeper(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="", model=ScriptedModel(thinks_forever), tools=[])
        await ctx.agent.run()

    return reg


@pytest.fixture
def thinking() -> asyncio.Event:
    return asyncio.Event()


@pytest.fixture
async def worker(server_url: str, prefix: str, thinking: asyncio.Event):
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4, lease_ttl_ms=1000)
    rt = Runtime(registry(thinking), settings=settings, run_worker=True)
    await rt.start()
    yield rt
    await rt.close()


async def test_create_with_args_state_and_delete(worker, server_url, prefix):
    created = await run(
        server_url, prefix, "create", "/notes/c1", "--message", "add from the cli", "--json"
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"url": "/notes/c1", "created": True}
    await worker.wait_idle("/notes/c1")
    state = await run(server_url, prefix, "state", "/notes/c1", "--json")
    assert json.loads(state.stdout)["notes"] == [{"id": 1, "text": "from the cli", "done": False}]
    table = await run(server_url, prefix, "state", "/notes/c1")
    assert "from the cli" in table.stdout

    bad_args = await run(server_url, prefix, "create", "/notes/c2", "--args", "{nope")
    assert bad_args.returncode == 1 and "--args is not JSON" in bad_args.stderr
    with_args = await run(server_url, prefix, "create", "/notes/c2", "--args", '{"k": 1}')
    assert with_args.returncode == 0, with_args.stderr
    assert (await worker.status("/notes/c2")).type == "notes"
    clash = await run(server_url, prefix, "create", "/notes/c2", "--args", '{"k": 2}')
    assert clash.returncode == 1 and "args" in clash.stderr

    deleted = await run(server_url, prefix, "delete", "/notes/c1")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == "deleted /notes/c1"
    with pytest.raises(EntityNotFoundError):
        await worker.status("/notes/c1")
    again = await run(server_url, prefix, "delete", "/notes/c1")
    assert again.returncode == 1 and "does not exist" in again.stderr
    missing = await run(server_url, prefix, "state", "/notes/nobody")
    assert missing.returncode == 1 and "does not exist" in missing.stderr


async def test_a_timeout_that_passed_exits_5(server_url, prefix):
    """No worker runs: neither the delete nor the compaction is done in time, which is
    exit code 5 (a --timeout passed), as for ``ask``."""
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4, lease_ttl_ms=1000)
    rt = Runtime(registry(), settings=settings, run_worker=True)
    await rt.start()
    try:
        await rt.send("/notes/d1", "add x")
        await rt.wait_idle("/notes/d1")
    finally:
        await rt.close()
    deleted = await run(server_url, prefix, "delete", "/notes/d1", "--timeout", "0.2")
    assert deleted.returncode == 5, deleted.stderr
    assert "error: /notes/d1 was not deleted within 0.2s" in deleted.stderr
    compacted = await run(server_url, prefix, "compact", "/notes/d1", "--timeout", "0.2")
    assert compacted.returncode == 5, compacted.stderr
    assert "error: /notes/d1 is still" in compacted.stderr


async def test_cancel_a_running_run(worker, server_url, prefix, thinking):
    await worker.send("/sleeper/s1", "sleep")
    # The run is open (its first commit, with its first step, is not made yet).
    await asyncio.wait_for(thinking.wait(), 30)
    cancelled = await run(server_url, prefix, "cancel", "/sleeper/s1", "--reason", "enough")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("cancel sent to /sleeper/s1: ")
    status = await worker.wait_idle("/sleeper/s1")
    last = (await worker.status("/sleeper/s1", runs=True)).last_run
    assert status.status == "idle" and last is not None
    assert (last.status, last.error) == ("cancelled", "enough")
    missing = await run(server_url, prefix, "cancel", "/sleeper/nobody")
    assert missing.returncode == 1 and "does not exist" in missing.stderr


async def _pending_call(rt: Runtime, url: str) -> str:
    await rt.send(url, "where am I?", client_tools=[LOCATION])
    status = await rt.wait_idle(url)
    assert status.status == "suspended"
    [action] = await rt.pending_actions(url)
    return action.tool_call_id


async def test_submit_and_fail_answer_client_tool_calls(worker, server_url, prefix):
    call = await _pending_call(worker, "/bot/b1")
    bad = await run(server_url, prefix, "submit", "/bot/b1", call, "not json")
    assert bad.returncode == 1 and "OUTPUT is not JSON" in bad.stderr
    invalid = await run(server_url, prefix, "submit", "/bot/b1", call, '{"city": 5}')
    assert invalid.returncode == 1 and "city" in invalid.stderr  # the output schema
    submitted = await run(server_url, prefix, "submit", "/bot/b1", call, '{"city": "Oslo"}')
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.startswith(f"submitted {call} of /bot/b1: ")
    await worker.wait_idle("/bot/b1")
    last = (await worker.status("/bot/b1", runs=True)).last_run
    assert last is not None and last.status == "completed"

    history = await run(server_url, prefix, "history", "/bot/b1")
    lines = history.stdout.splitlines()
    assert any(line.startswith("user") and "where am I?" in line for line in lines)
    assert any(line.startswith("calls") and "getLocation" in line for line in lines)
    assert any(line.startswith("result") and "Oslo" in line for line in lines)
    assert any(line.startswith("agent") and "The client said" in line for line in lines)
    raw = json.loads((await run(server_url, prefix, "history", "/bot/b1", "--json")).stdout)
    assert [e["t"] for e in raw][:2] == ["user_turn", "assistant_step"]

    call = await _pending_call(worker, "/bot/b2")
    failed = await run(server_url, prefix, "fail", "/bot/b2", call, "--error", "no GPS here")
    assert failed.returncode == 0, failed.stderr
    await worker.wait_idle("/bot/b2")
    journal = await run(server_url, prefix, "history", "/bot/b2")
    assert any(
        line.startswith("error") and "no GPS here" in line for line in journal.stdout.splitlines()
    )
    twice = await run(server_url, prefix, "fail", "/bot/b2", call)
    assert twice.returncode == 1 and "error:" in twice.stderr


async def test_tail_prints_a_readable_transcript(worker, server_url, prefix):
    call = await _pending_call(worker, "/bot/t1")
    await worker.submit_tool_result("/bot/t1", call, {"city": "Oslo"})
    await worker.wait_idle("/bot/t1")
    await worker.send("/notes/t2", "add milk")
    await worker.wait_idle("/notes/t2")

    tail = await run(server_url, prefix, "tail", "/bot/t1")
    assert tail.returncode == 0, tail.stderr
    words = [line.split()[1:] for line in tail.stdout.splitlines()]
    labels = [w[0] for w in words if w]
    assert labels[:2] == ["created", "message"]
    assert {"calls", "waits", "answer", "result", "agent", "run"} <= set(labels)
    text = tail.stdout
    assert "from a client: where am I?" in text
    assert f"getLocation {{}} waits for the client ({call})" in text
    assert "The client said" in text and "completed, 2 model step(s), 1 tool call(s)" in text
    assert "tool_intent" not in text and "{" not in text.split("message", 1)[0]

    notes_tail = await run(server_url, prefix, "tail", "/notes/t2")
    [state] = [line for line in notes_tail.stdout.splitlines() if " state " in line]
    assert "insert notes[1]" in state
    raw = await run(server_url, prefix, "tail", "/notes/t2", "--json")
    assert [json.loads(line)["event"]["t"] for line in raw.stdout.splitlines()][:2] == [
        "created",
        "msg",
    ]
