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
  can reuse them), and its result follows it;
* a run the API refused as invalid (a ``turn_failed`` note with ``withdrawn``) is
  left out but for the text of its user turns and a note that it failed: the
  content that made the request invalid (an image, a document, a tool result) is
  not sent again;
* blocks keep what the API returned that it takes back (a text block's
  ``citations``, a tool_use block's ``caller``, thinking signatures, server-tool
  blocks), as journaled.

:func:`render_input` is the other direction's first step: how an input of a wake
(a message, a child's result, ...) reads as user content in the journal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from .content_blocks import check_block
from .errors import InvalidContentError
from .events import (
    AssistantStep,
    Changed,
    ChildRunFinished,
    ConversationCompacted,
    DeliveryFailed,
    HistoryEvent,
    LogRecord,
    Message,
    RunFailedNote,
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
    """The whole journal as Messages API messages (see :class:`Projection`)."""
    projection = Projection()
    projection.extend(history)
    return projection.messages()


def compaction_note(event: ConversationCompacted) -> list[dict[str, Any]]:
    """How a compaction reads at the start of the conversation."""
    if event.mode == "compact" and event.summary:
        return [{"type": "text", "text": f"[Summary of the earlier conversation]\n{event.summary}"}]
    if event.mode == "trim":
        return [
            {
                "type": "text",
                "text": f"[{event.turns} earlier turns were dropped to fit the context window]",
            }
        ]
    return []


class Projection:
    """The projection of a journal, built incrementally: :meth:`extend` with the events
    journaled since, then :meth:`messages`. Each step of a run costs what it adds, not
    the length of the conversation.

    A message dict handed out by :meth:`messages` is never changed afterwards (a turn
    merged into the last message replaces it with a new dict), so a caller may keep
    the list it got (``ScriptedModel`` records requests without copying them).
    """

    def __init__(self) -> None:
        self.source: list[HistoryEvent] | None = None  # the journal list it follows
        self.consumed = 0  # events of ``source`` taken in
        self._start()

    def _start(self) -> None:
        # Where the run being taken in started (to leave it out if it is withdrawn).
        self._run: str | None = None
        self._mark: _Mark | None = None
        self._run_text: list[dict[str, Any]] = []  # the text of its user turns
        self._messages: list[dict[str, Any]] = []
        # The tool calls of the last assistant message, in order: (id sent, id journaled).
        self._open: list[tuple[str, str]] = []
        self._results: dict[str, ToolOutcome] = {}  # by journaled id
        self._used: set[str] = set()  # every tool_use id in the request so far
        self._held: list[dict[str, Any]] = []  # user content that arrived while calls were open

    def follows(self, history: list[HistoryEvent]) -> bool:
        """Whether ``history`` is the list this projection took in, grown only by appends."""
        return history is self.source and len(history) >= self.consumed

    def catch_up(self, history: list[HistoryEvent]) -> None:
        """Take in the events of ``history`` appended since the last call."""
        if self.source is None:
            self.source = history
        self.extend(history[self.consumed :])

    def extend(self, events: list[HistoryEvent]) -> None:
        for event in events:
            self._take(event)
        self.consumed += len(events)

    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far, with the open calls answered (as interrupted, if
        they have no result yet) and the held user content after them."""
        messages = list(self._messages)
        if self._open:
            _add(messages, "user", [self._answer(sent, call) for sent, call in self._open])
        _add(messages, "user", self._held)
        return messages

    # -- the fold ------------------------------------------------------------------

    def _answer(self, sent_id: str, call_id: str) -> dict[str, Any]:
        outcome = self._results.get(call_id)
        if outcome is None:
            return tool_result_block(sent_id, [{"type": "text", "text": INTERRUPTED}], True)
        return tool_result_block(sent_id, _nonblank(outcome.content, "(empty)"), outcome.is_error)

    def _settle(self) -> None:
        """Answer the open tool calls, in call order, then add the user content held back."""
        if self._open:
            _add(self._messages, "user", [self._answer(s, c) for s, c in self._open])
            self._open.clear()
            self._results.clear()
        _add(self._messages, "user", self._held)
        self._held = []

    def _unique(self, call_id: str) -> str:
        sent_id, n = call_id, 0
        while sent_id in self._used:
            n += 1
            sent_id = f"{call_id}_{n}"
        self._used.add(sent_id)
        return sent_id

    def _begin_run(self, run_id: str) -> None:
        """Mark where run ``run_id`` starts: what a withdrawal goes back to."""
        if run_id == self._run:
            return
        self._run = run_id
        self._run_text = []
        self._mark = _Mark(
            size=len(self._messages),
            last=self._messages[-1] if self._messages else None,
            open=list(self._open),
            results=dict(self._results),
            held=list(self._held),
        )

    def _withdraw(self, event: RunFailedNote) -> None:
        """Leave out what the run added (but for its user text), then note its failure."""
        mark = self._mark
        if mark is None or self._run != event.run_id:
            return  # its start is not in view (compacted away): nothing of it to take back
        del self._messages[mark.size :]
        if mark.last is not None:
            self._messages[-1] = mark.last
        self._open, self._results, self._held = mark.open, mark.results, mark.held
        note = {"type": "text", "text": WITHDRAWN}
        if self._open:
            self._held.extend([*self._run_text, note])
        else:
            _add(self._messages, "user", [*self._run_text, note])
        self._run_text = []

    def _take(self, event: HistoryEvent) -> None:
        run_id = getattr(event, "run_id", None)
        if isinstance(event, UserTurn | AssistantStep | ToolOutcome) and run_id is not None:
            self._begin_run(run_id)
        if isinstance(event, UserTurn):
            self._run_text.extend(
                b for b in event.content if b.get("type") == "text" and not _blank_text(b)
            )
            content = _nonblank(event.content, "(empty message)")
            if self._open:  # calls still wait (a suspended run): results come first
                self._held.extend(content)
            else:
                _add(self._messages, "user", content)
        elif isinstance(event, AssistantStep):
            self._settle()
            if not self._messages:  # the API wants a user message first
                _add(self._messages, "user", [{"type": "text", "text": "(conversation start)"}])
            content = _nonblank(event.content, "(no content)")
            for block in tool_uses(content):
                call_id = block["id"]
                block["id"] = self._unique(call_id)
                self._open.append((block["id"], call_id))
            _add(self._messages, "assistant", content)
        elif isinstance(event, ToolOutcome) and any(event.tool_call_id == c for _, c in self._open):
            self._results[event.tool_call_id] = event
            if self._held and all(c in self._results for _, c in self._open):
                self._settle()
        elif isinstance(event, ConversationCompacted):
            # Only ever first (it replaces what came before it): start afresh from it.
            self._start()
            _add(self._messages, "user", compaction_note(event))
        elif isinstance(event, RunFailedNote):
            if event.withdrawn:
                self._withdraw(event)
            self._settle()
            if self._messages and self._messages[-1]["role"] == "user":
                why = f": {event.error}" if event.error else ""
                note = f"[no answer: the run failed{why}]"
                _add(self._messages, "assistant", [{"type": "text", "text": note}])


WITHDRAWN = (
    "[the rest of this turn was withdrawn: the API refused the request as invalid, so "
    "its attachments and tool results are not sent again]"
)


@dataclass
class _Mark:
    """The projection's state where a run started."""

    size: int  # messages then
    last: dict[str, Any] | None  # the last of them (a later turn may replace it)
    open: list[tuple[str, str]]
    results: dict[str, ToolOutcome]
    held: list[dict[str, Any]]


def _add(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Append ``blocks`` as a ``role`` message, merged into the last one if it has that
    role (by replacing it: a message dict handed out is never changed)."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1] = {"role": role, "content": [*messages[-1]["content"], *blocks]}
    else:
        messages.append({"role": role, "content": list(blocks)})


def render_input(record: LogRecord) -> list[dict[str, Any]]:
    """How an input appears to the model: messages as text followed by their content
    blocks (images and documents as native blocks), results of children as notes."""
    event = record.event
    if isinstance(event, Message):
        return _message_content(event)
    if isinstance(event, ChildRunFinished):
        if event.status == "completed":
            body = event.response if event.response is not None else "(no response included)"
            typed = f" with a {event.output_type}" if event.output_type else ""
            note = f"[{event.child} finished its run{typed}]\n{body}"
        else:
            note = f"[{event.child} {event.status}: {event.error or 'no error given'}]"
            if event.status in ("truncated", "refused") and event.response:
                note += f"\n{event.response}"  # what it did answer
        return [{"type": "text", "text": note}]
    if isinstance(event, Changed):
        return [
            {"type": "text", "text": f"[{event.entity} changed: {', '.join(event.collections)}]"}
        ]
    if isinstance(event, DeliveryFailed):
        return [{"type": "text", "text": f"[could not {event.kind} {event.target}: {event.error}]"}]
    return []


def _message_content(event: Message) -> list[dict[str, Any]]:
    """The payload as text (none for a payload of None or "" beside content blocks),
    then the content blocks. A block that is not one (content written around the
    client's check) becomes a note saying so: one bad block must not fail every run."""
    payload = event.payload
    if isinstance(payload, str):
        text = payload
    elif isinstance(payload, dict) and isinstance(payload.get("text"), str):
        text = payload["text"]
    elif payload is None and event.content:
        text = ""
    else:
        text = json.dumps(msgspec.to_builtins(payload), ensure_ascii=False)
    blocks: list[dict[str, Any]] = []
    for i, block in enumerate(event.content or []):
        try:
            blocks.append(check_block(block, f"content[{i}]", deep=False))
        except InvalidContentError as exc:
            blocks.append({"type": "text", "text": f"[an attachment was left out: {exc}]"})
    if event.sender:
        text = f"[message from {event.sender}]\n{text}"
    if text.strip() or not blocks:
        blocks.insert(0, {"type": "text", "text": text or "(empty message)"})
    return blocks
