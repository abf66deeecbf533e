"""An entity's log as a readable transcript (``wakeful tail``, ``wakeful history``).

One line per event that tells something: the time, a short label, and what
happened in words (a message and who sent it, the agent's text, a tool call and
its result, a child spawned or finishing, a state change, a failure). Events
that only repeat another (a tool intent repeats its step's calls, a user turn
repeats its messages) are left out; ``--json`` prints every event raw.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from .content_blocks import describe_block
from .events import (
    ActionRequested,
    ActionSettled,
    AssistantStep,
    CancelRequested,
    Changed,
    ChildRunFinished,
    Created,
    DeleteRequested,
    DeliveryFailed,
    Effect,
    EntityFailed,
    HandlerFailed,
    LogRecord,
    Message,
    Outbox,
    Resumed,
    RunFinished,
    RunStarted,
    StateChanged,
    Subscribed,
    TimerFired,
    ToolOutcome,
    TrimmedRecord,
    UndecodableRecord,
    UserTurn,
)
from .live import LiveRecord
from .terminal import escape, short

WIDTH = 160  # characters of a payload or a text shown on one line


def lines(record: LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord) -> list[str]:
    """The transcript lines of one record (Rich markup; none for a repeat)."""
    when = _clock(record.id)
    if isinstance(record, TrimmedRecord):
        return [f"[dim]{when}[/] [bold yellow]{'TRIMMED':<9}[/] {escape(record.message)}"]
    if isinstance(record, UndecodableRecord):
        return [f"[dim]{when}[/] [bold red]{'unreadable':<9}[/] {escape(record.error)}"]
    if isinstance(record, LiveRecord):
        live = record.event
        detail = live.data if live.kind == "text" else msgspec.to_builtins(live)
        return [f"[dim]{when} {'live':<9} {escape(short(detail, WIDTH))}[/]"]
    return [f"[dim]{when}[/] {line}" for line in _describe(record.event)]


def history_lines(events: list[Any]) -> list[str]:
    """The agent journal (``Runtime.history``) as lines: what the user said, then the
    agent's steps, calls and results."""
    out = []
    for event in events:
        if isinstance(event, UserTurn):
            for block in event.content:
                if block.get("type") in ("text", "image", "document"):
                    text = short(describe_block(block), WIDTH)
                    out.append(_label("user", "bold") + escape(text))
        else:
            out.extend(_describe(event))
    return out


def _describe(event: Any) -> list[str]:
    if isinstance(event, Created):
        parent = f" by {event.parent}" if event.parent else ""
        args = f" with args {short(event.args, WIDTH)}" if event.args is not None else ""
        return [_label("created", "cyan") + escape(f"a {event.type}{parent}{args}")]
    if isinstance(event, Message):
        sender = event.sender or "a client"
        who = f" ({short(event.identity)})" if event.identity else ""
        text = _text(event.payload) if event.payload is not None or not event.content else ""
        attached = " ".join(describe_block(b) for b in event.content or [])
        line = f"from {sender}{who}: {' '.join(t for t in (text, attached) if t)}"
        return [_label("message", "bold") + escape(line)]
    if isinstance(event, AssistantStep):
        out = []
        for block in event.content:
            if block.get("type") == "text" and block.get("text", "").strip():
                out.append(_label("agent", "green") + escape(short(block["text"], WIDTH)))
            elif block.get("type") == "tool_use":
                call = f"{block['name']} {short(block.get('input'), WIDTH)}"
                out.append(_label("calls", "blue") + escape(call))
        return out
    if isinstance(event, ToolOutcome):
        text = "".join(b.get("text", "") for b in event.content if b.get("type") == "text")
        label = _label("error", "red") if event.is_error else _label("result", "blue")
        return [label + escape(f"{event.name}: {short(text, WIDTH)}")]
    if isinstance(event, Outbox | TimerFired):
        return [_effect(e) for e in event.effects]
    if isinstance(event, StateChanged):
        ops = ", ".join(f"{op.op} {op.collection}[{short(op.key, 40)}]" for op in event.ops)
        return [_label("state", "magenta") + escape(ops)]
    return _lifecycle(event)


def _lifecycle(event: Any) -> list[str]:
    """Runs, children, actions, failures and the operator's requests."""
    if isinstance(event, RunStarted):
        return [_label("run", "dim") + escape(f"{event.run_id} started")]
    if isinstance(event, RunFinished):
        style = {"completed": "green", "truncated": "yellow", "refused": "magenta"}.get(
            event.status, "red"
        )
        tail = f": {event.error}" if event.error else ""
        summary = f"{event.steps} model step(s), {event.tool_calls} tool call(s)"
        return [_label("run", style) + escape(f"{event.run_id} {event.status}, {summary}{tail}")]
    if isinstance(event, ChildRunFinished):
        said = f": {short(event.response or event.error or '', WIDTH)}"
        return [_label("child", "cyan") + escape(f"{event.child} {event.status}{said}")]
    if isinstance(event, ActionRequested):
        waits = "an approval" if event.kind == "approval" else "the client"
        call = f"{event.tool} {short(event.input)} waits for {waits} ({event.tool_call_id})"
        return [_label("waits", "yellow") + escape(call)]
    if isinstance(event, ActionSettled):
        by = f" by {short(event.by)}" if event.by else ""
        return [_label("answer", "yellow") + escape(f"{event.tool_call_id} {event.decision}{by}")]
    if isinstance(event, HandlerFailed):
        text = f"attempt {event.attempt}: {event.error_type}: {event.error}"
        return [_label("error", "red") + escape(text)]
    if isinstance(event, EntityFailed):
        text = f"parked after {event.attempts} attempt(s): {event.error}"
        return [_label("failed", "bold red") + escape(text)]
    if isinstance(event, DeliveryFailed):
        text = f"{event.kind} to {event.target} failed: {event.error}"
        return [_label("error", "red") + escape(text)]
    if isinstance(event, CancelRequested):
        return [_label("cancel", "yellow") + escape(f"{event.reason} (by {event.by or '?'})")]
    if isinstance(event, DeleteRequested):
        return [_label("delete", "yellow") + escape(f"requested by {event.by or '?'}")]
    if isinstance(event, Resumed):
        skipped = f", skipped {', '.join(event.skipped)}" if event.skipped else ""
        return [_label("resumed", "yellow") + escape(f"by an operator{skipped}")]
    if isinstance(event, Subscribed):
        return [_label("watched", "dim") + escape(f"by {event.subscriber} ({event.spec.kind})")]
    if isinstance(event, Changed):
        text = f"{event.entity} changed {', '.join(event.collections)}"
        return [_label("changed", "cyan") + escape(text)]
    if isinstance(event, UserTurn):
        return []  # the messages it takes are shown where they arrived
    return []  # a tool intent repeats its step's calls


def _effect(effect: Effect) -> str:
    if effect.kind == "spawn":
        return _label("spawned", "cyan") + escape(effect.target)
    if effect.kind == "send":
        return _label("sent", "cyan") + escape(f"to {effect.target}: {_text(effect.payload)}")
    if effect.kind == "notify" and isinstance(effect.notice, ChildRunFinished):
        notice = effect.notice
        return _label("notified", "dim") + escape(f"{effect.target}: run {notice.status}")
    return _label(effect.kind, "dim") + escape(effect.target)


def _label(word: str, style: str) -> str:
    return f"[{style}]{word:<9}[/] "


def _text(payload: Any) -> str:
    return short(payload, WIDTH)


def _clock(stream_id: str) -> str:
    head = stream_id.split("-", 1)[0]
    if not head.isdigit():
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(int(head) / 1000))
