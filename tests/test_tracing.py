"""Tracing: one trace follows a message through every entity and process it touches."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.faults import crash_and_recover
from wakeful import Runtime, Settings, tracing
from wakeful.entities import registry as entities_registry
from wakeful.events import Created, Message, decode_entry

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
ASSISTANT = "/assistant/traced"
QUESTION = "Please research what 6 * 7 is."


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entities pick Claude when a key is set; these tests use the scripted models."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.set_tracer_provider(None)


class Node(msgspec.Struct):
    """A span as both exporters give it: ids as hex, the parent's id or None."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    links: list[str] = []  # span ids this span links to (the other inputs of a wake)


def _node(span: ReadableSpan) -> Node:
    context = span.get_span_context()
    assert context is not None
    return Node(
        span.name,
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
        f"{span.parent.span_id:016x}" if span.parent is not None else None,
        dict(span.attributes or {}),
        [f"{link.context.span_id:016x}" for link in span.links],
    )


def _from_json(line: str) -> Node:
    data = json.loads(line)
    parent = data["parent_id"]
    return Node(
        data["name"],
        data["context"]["trace_id"].removeprefix("0x"),
        data["context"]["span_id"].removeprefix("0x"),
        parent.removeprefix("0x") if parent else None,
        data["attributes"],
    )


def _ancestors(node: Node, by_id: dict[str, Node]) -> list[Node]:
    chain = []
    while node.parent_id is not None:
        node = by_id[node.parent_id]
        chain.append(node)
    return chain


def _one_tree(nodes: list[Node]) -> tuple[Node, dict[str, Node]]:
    """The root of ``nodes``, which must form one tree of one trace."""
    by_id = {n.span_id: n for n in nodes}
    assert len({n.trace_id for n in nodes}) == 1, sorted({n.name for n in nodes})
    roots = [n for n in nodes if n.parent_id is None or n.parent_id not in by_id]
    assert [r.name for r in roots] == ["wakeful.send"]
    return roots[0], by_id


def _check_delegation(nodes: list[Node]) -> None:
    """The delegated research run is one tree: send -> parent wake -> agent -> dispatch
    -> spawn -> child wake -> child agent -> calculator; child wake -> run_finished ->
    parent wake."""
    root, by_id = _one_tree(nodes)
    assert root.attributes["messaging.destination.name"] == ASSISTANT

    def named(name: str, **attributes: Any) -> list[Node]:
        return [
            n
            for n in nodes
            if n.name == name and all(n.attributes.get(k) == v for k, v in attributes.items())
        ]

    [child_agent] = [n for n in named("invoke_agent") if "/researcher/" in n.name] or [
        n for n in nodes if n.name.startswith("invoke_agent /researcher/")
    ]
    child_url = child_agent.attributes["gen_ai.agent.name"]
    [calculator] = named("execute_tool calculator")
    [dispatch] = named("execute_tool spawn_agent")
    assert calculator.attributes["gen_ai.tool.call.id"]
    [spawn] = named("wakeful.deliver", **{"messaging.operation.name": "spawn"})
    [notify] = named("wakeful.deliver", **{"messaging.operation.name": "notify"})
    [child_wake] = named("wakeful.wake", **{"wakeful.entity": child_url})
    parent_wakes = named("wakeful.wake", **{"wakeful.entity": ASSISTANT})
    assert len(parent_wakes) == 2  # the question, then the child's result

    assert dispatch in _ancestors(spawn, by_id)
    assert _ancestors(child_wake, by_id)[0] == spawn
    assert child_agent in _ancestors(calculator, by_id)
    # The run's end is committed with the child's wake (after the agent span), which
    # delivers run_finished to the parent.
    assert child_wake in _ancestors(notify, by_id)
    second = next(w for w in parent_wakes if notify in _ancestors(w, by_id))
    assert second.parent_id == notify.span_id  # run_finished woke the parent
    first = next(w for w in parent_wakes if w is not second)
    assert first.parent_id == root.span_id

    chats = [n for n in nodes if n.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) >= 4  # two parent steps per run, two of the child
    for chat in chats:
        assert chat.name == f"chat {chat.attributes['gen_ai.request.model']}"
        assert chat.attributes["gen_ai.usage.input_tokens"] >= 0
        assert chat.attributes["gen_ai.usage.output_tokens"] >= 0
        assert list(chat.attributes["gen_ai.response.finish_reasons"]) in (
            ["tool_use"],
            ["end_turn"],
        )
        assert any(a.name.startswith("invoke_agent") for a in _ancestors(chat, by_id))


async def test_a_delegated_agent_run_is_one_trace(cluster, spans):
    rt = await cluster.runtime(entities_registry)
    answer = await rt.ask(ASSISTANT, QUESTION, timeout=30)
    assert "42" in answer

    def finished() -> list[Node]:
        return [_node(s) for s in spans.get_finished_spans()]

    # The parent's second wake span ends after its commit, which ``ask`` may beat.
    await _until(lambda: len([n for n in finished() if n.name == "wakeful.wake"]) >= 3)
    _check_delegation(finished())


async def test_the_trace_context_is_kept_in_the_log(cluster, spans):
    rt = await cluster.runtime(entities_registry, run_worker=False)
    await rt.send("/notes/n", "add x")
    [(entry_id, fields), *_] = await rt.store.read_log("/notes/n", "0-0", count=10)
    [send] = [_node(s) for s in spans.get_finished_spans()]
    created = decode_entry(entry_id, fields, "/notes/n").event
    assert isinstance(created, Created)
    assert created.trace is not None
    assert created.trace["traceparent"].startswith(f"00-{send.trace_id}-{send.span_id}-")


async def test_without_a_tracer_nothing_is_written_to_the_log(cluster):
    rt = await cluster.runtime(entities_registry, run_worker=False)
    await rt.send("/notes/n", "add x")
    entries = await rt.store.read_log("/notes/n", "0-0", count=10)
    events = [decode_entry(i, f, "/notes/n").event for i, f in entries]
    assert [type(e) for e in events] == [Created, Message]
    assert all(e.trace is None for e in events)
    assert all(b"trace" not in f[b"e"] for _, f in entries)


def test_a_global_provider_set_after_start_is_followed(monkeypatch):
    """Without a provider no span is made; one set later (the API's global, set once
    per process) is followed from then on, as the check caches nothing."""
    from opentelemetry import trace as otel_trace

    assert tracing._active() is None
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", TracerProvider())
    assert tracing._active() is not None
    with tracing.handler_span("/notes/n", "notes") as span:
        assert span.get_span_context().is_valid


def test_a_provider_named_in_the_environment_is_followed(monkeypatch):
    """OTEL_PYTHON_TRACER_PROVIDER names a provider the API loads on first use; set
    after start, it is still seen (the fast check reads the live environment)."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.util._once import Once

    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", None)  # both restored after
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    assert tracing._active() is None
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    assert tracing._active() is not None


async def test_a_trace_crosses_from_a_client_to_a_worker_process(
    spans, server_url, prefix, tmp_path
):
    """The client sends in this process; a worker process (its spans in a file) runs the
    parent and the child: one trace, the worker's first wake under the client's send."""
    span_file = tmp_path / "spans.jsonl"
    span_file.touch()
    env = {
        **os.environ,
        "WAKEFUL_PREFIX": prefix,
        "WAKEFUL_PARTITIONS": "4",
        "WAKEFUL_TEST_SPANS": str(span_file),
    }
    command = ["worker", "tests.apps.traced:registry", "--redis", server_url]
    worker = subprocess.Popen(
        [sys.executable, "-m", "wakeful.cli", *command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4)
    rt = Runtime(entities_registry, settings=settings, run_worker=False)
    await rt.start()
    try:
        await rt.send(ASSISTANT, QUESTION)
        await rt.wait_idle(ASSISTANT, timeout=60)

        def worker_spans() -> list[Node]:
            lines = span_file.read_text().splitlines()
            return [_from_json(line) for line in lines if line.strip()]

        await _until(lambda: len([n for n in worker_spans() if n.name == "wakeful.wake"]) >= 3)
    finally:
        await rt.close()
        worker.terminate()
        worker.communicate(timeout=30)
    [send] = [_node(s) for s in spans.get_finished_spans()]
    _check_delegation([send, *worker_spans()])


async def _until(condition: Any, timeout: float = 30.0) -> None:
    """Wait for ``condition()`` (spans are exported as they end, after the commits)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the spans did not arrive"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("point", "hit"),
    [
        ("deliver:after-spawn", 1),  # the spawn is delivered again by the next worker
        ("flush:before-commit", 2),  # the dispatch is in doubt and runs again
    ],
)
async def test_a_trace_goes_on_after_a_worker_crash(cluster, spans, point, hit):
    """The next worker continues the trace from the log: the retried wake and the
    redelivered spawn are in the same tree as the send."""
    await crash_and_recover(cluster, entities_registry, ASSISTANT, QUESTION, point, hit)

    def finished() -> list[Node]:
        return [_node(s) for s in spans.get_finished_spans()]

    def parent_woken_by_child() -> bool:
        """A wake of the parent took the child's result: as its first input (its parent
        span), or with the retried message (a link), if the child was quicker."""
        nodes = finished()
        notices = {
            n.span_id for n in nodes if n.attributes.get("messaging.operation.name") == "notify"
        }
        return any(
            n.name == "wakeful.wake"
            and n.attributes["wakeful.entity"] == ASSISTANT
            and ({n.parent_id, *n.links} & notices)
            for n in nodes
        )

    await _until(parent_woken_by_child)
    nodes = finished()
    root, by_id = _one_tree(nodes)
    parent_wakes = [
        n for n in nodes if n.name == "wakeful.wake" and n.attributes["wakeful.entity"] == ASSISTANT
    ]
    assert len(parent_wakes) >= 2  # the crashed one, its retry (which may take the result)
    child_wakes = [
        n
        for n in nodes
        if n.name == "wakeful.wake" and "/researcher/" in n.attributes["wakeful.entity"]
    ]
    assert child_wakes and all(root in _ancestors(n, by_id) for n in child_wakes)
