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
* tool results for ids the preceding assistant message did not use are dropped;
* an assistant message is never empty, and has no blank text blocks.
"""

from __future__ import annotations

from typing import Any

from .events import AssistantStep, HistoryEvent, ToolOutcome, UserTurn

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


def project(history: list[HistoryEvent]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    open_calls: list[str] = []  # tool_use ids of the last assistant message, in order
    results: dict[str, dict[str, Any]] = {}

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    def settle() -> None:
        """Answer the open tool calls, in call order, before anything else is added."""
        if open_calls:
            add(
                "user",
                [
                    results.get(call_id)
                    or tool_result_block(call_id, [{"type": "text", "text": INTERRUPTED}], True)
                    for call_id in open_calls
                ],
            )
            open_calls.clear()
            results.clear()

    for event in history:
        if isinstance(event, UserTurn):
            settle()
            add("user", [dict(b) for b in event.content])
        elif isinstance(event, AssistantStep):
            settle()
            if not messages:  # the API wants a user message first
                add("user", [{"type": "text", "text": "(conversation start)"}])
            content = [dict(b) for b in event.content if not _blank_text(b)]
            content = content or [{"type": "text", "text": "(no content)"}]
            add("assistant", content)
            open_calls.extend(b["id"] for b in tool_uses(content))
        elif isinstance(event, ToolOutcome) and event.tool_call_id in open_calls:
            results[event.tool_call_id] = tool_result_block(
                event.tool_call_id, [dict(b) for b in event.content], event.is_error
            )
    settle()
    return messages
