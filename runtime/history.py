"""Project the journal into a valid Messages API conversation.

The journal (``SystemState.history``) holds user turns, assistant steps, tool
intents and tool results, in the order the runtime wrote them. The projection
always yields a request the Messages API accepts, whatever the journal holds
(a crash can leave a tool call without a result):

* messages alternate, starting with a user message; consecutive turns of one
  role are merged;
* every ``tool_use`` is answered in the next user message by a ``tool_result``
  with the same id, in call order; a call that has no journaled result gets an
  error result saying it was interrupted;
* user turns journaled while calls are still open (a message that arrives
  while the run waits for a client tool or an approval) follow those calls'
  results, so a result that comes later is not hidden behind the message;
* tool results for ids the preceding assistant message did not use are dropped;
* no message and no tool result is empty, and none has blank text blocks (the
  API rejects those; a tool or a message can produce whitespace-only text);
* a tool_use id already used earlier in the request is sent under a fresh id
  (the API wants them unique; a scripted model, or another provider's journal,
  can reuse them), and its result follows it.

:func:`render_input` is the other direction's first step: how an input of a wake
(a message, a child's result, ...) reads as user content in the journal.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .events import (
    AssistantStep,
    Changed,
    ChildRunFinished,
    DeliveryFailed,
    HistoryEvent,
    LogRecord,
    Message,
    ToolOutcome,
    UserTurn,
)

INTERRUPTED = "The tool call was interrupted before it returned a result; it did not complete."


def tool_result_block(
    tool_use_id: str, content: list[dict[str, Any]], is_error: bool
) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def tool_uses(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in content if b.get("type") == "tool_use"]


def _blank_text(block: dict[str, Any]) -> bool:
    """The API rejects text blocks without non-whitespace text."""
    return block.get("type") == "text" and not str(block.get("text", "")).strip()


def _nonblank(blocks: list[dict[str, Any]], placeholder: str) -> list[dict[str, Any]]:
    """Copies of ``blocks`` without blank text blocks, or a placeholder if none is left."""
    kept = [dict(b) for b in blocks if not _blank_text(b)]
    return kept or [{"type": "text", "text": placeholder}]


def project(history: list[HistoryEvent]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    # The tool calls of the last assistant message, in order: (id sent, id journaled).
    open_calls: list[tuple[str, str]] = []
    results: dict[str, ToolOutcome] = {}  # by journaled id
    used: set[str] = set()  # every tool_use id in the request so far

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    def answer(sent_id: str, call_id: str) -> dict[str, Any]:
        outcome = results.get(call_id)
        if outcome is None:
            return tool_result_block(sent_id, [{"type": "text", "text": INTERRUPTED}], True)
        return tool_result_block(sent_id, _nonblank(outcome.content, "(empty)"), outcome.is_error)

    held: list[dict[str, Any]] = []  # user content that arrived while calls were open

    def settle() -> None:
        """Answer the open tool calls, in call order, then add the user content held back."""
        if open_calls:
            add("user", [answer(sent_id, call_id) for sent_id, call_id in open_calls])
            open_calls.clear()
            results.clear()
        add("user", held)
        held.clear()

    def unique(call_id: str) -> str:
        sent_id, n = call_id, 0
        while sent_id in used:
            n += 1
            sent_id = f"{call_id}_{n}"
        used.add(sent_id)
        return sent_id

    for event in history:
        if isinstance(event, UserTurn):
            content = _nonblank(event.content, "(empty message)")
            if open_calls:  # calls still wait (a suspended run): results come first
                held.extend(content)
            else:
                add("user", content)
        elif isinstance(event, AssistantStep):
            settle()
            if not messages:  # the API wants a user message first
                add("user", [{"type": "text", "text": "(conversation start)"}])
            content = _nonblank(event.content, "(no content)")
            for block in tool_uses(content):
                call_id = block["id"]
                block["id"] = unique(call_id)
                open_calls.append((block["id"], call_id))
            add("assistant", content)
        elif isinstance(event, ToolOutcome) and any(event.tool_call_id == c for _, c in open_calls):
            results[event.tool_call_id] = event
            if held and all(c in results for _, c in open_calls):
                settle()
    settle()
    return messages


def render_input(record: LogRecord) -> list[dict[str, Any]]:
    """How an input appears to the model: messages as text, results of children as notes."""
    event = record.event
    if isinstance(event, Message):
        payload = event.payload
        if isinstance(payload, str):
            text = payload
        elif isinstance(payload, dict) and isinstance(payload.get("text"), str):
            text = payload["text"]
        else:
            text = json.dumps(msgspec.to_builtins(payload), ensure_ascii=False)
        if event.sender:
            text = f"[message from {event.sender}]\n{text}"
        return [{"type": "text", "text": text or "(empty message)"}]
    if isinstance(event, ChildRunFinished):
        if event.status == "completed":
            body = event.response if event.response is not None else "(no response included)"
            note = f"[{event.child} finished its run]\n{body}"
        else:
            note = f"[{event.child} {event.status}: {event.error or 'no error given'}]"
        return [{"type": "text", "text": note}]
    if isinstance(event, Changed):
        return [
            {"type": "text", "text": f"[{event.entity} changed: {', '.join(event.collections)}]"}
        ]
    if isinstance(event, DeliveryFailed):
        return [{"type": "text", "text": f"[could not {event.kind} {event.target}: {event.error}]"}]
    return []
