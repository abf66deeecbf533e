"""Terminal output of the CLI, with Rich: tables and colours on a terminal, plain
text when piped, JSON with ``--json``.

The reply of ``wakeful ask`` goes to stdout (only the agent's words, so it can be
piped); what happens around it (tool calls, progress, approvals, children) goes
to stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table

from .events import (
    ActionRequested,
    ActionSettled,
    AssistantStep,
    ChildRunFinished,
    EntityFailed,
    HandlerFailed,
    LogRecord,
    RunFinished,
    RunStarted,
    RuntimeErrorRecorded,
    ToolData,
    ToolIntent,
    ToolOutcome,
    TrimmedRecord,
    UndecodableRecord,
    plain,
)
from .live import LiveRecord

# Control characters of the text printed (C0 but tab and newline, DEL, C1), shown
# as escapes: what an entity's log holds comes from HTTP clients and models.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


class SafeConsole(Console):
    """A Rich console that never writes a control character of the text it prints.

    An HTTP client's message (``\\x1b]0;title\\x07``, ``\\x1b[2J``) printed as it is by
    ``wakeful tail`` or ``state`` would drive the operator's terminal: retitle it,
    clear it, rewrite lines already shown. Rich's own styles and cursor moves are
    not text (a style, a control segment), so they pass; every text segment has its
    control characters escaped, whichever command printed it."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment
            if segment.control
            else Segment(segment.text.translate(_CONTROLS), segment.style)
            for segment in buffer
        )


out = SafeConsole(highlight=False, soft_wrap=True, emoji=False)
err = SafeConsole(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def _reader_went_away() -> None:
    """Rich exits with status 1 when stdout's reader closes the pipe; let the CLI
    handle it like a plain ``print`` (quietly, exit 141)."""
    raise BrokenPipeError


# Rich has no setting for this: replace the method on this one console.
out.on_broken_pipe = _reader_went_away  # type: ignore[method-assign]


def print_json(data: Any) -> None:
    print(json.dumps(plain(data), indent=2, default=str))


def short(value: Any, limit: int = 80) -> str:
    """One line of at most ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(plain(value), default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_style(status: str) -> str:
    return {
        "idle": "green",
        "completed": "green",
        "busy": "yellow",
        "running": "yellow",
        "waiting": "yellow",
        "suspended": "yellow",
        "failed": "bold red",
        "cancelled": "red",
        "truncated": "yellow",
        "refused": "magenta",
    }.get(status, "")


def key_values(title: str, rows: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column(overflow="fold")
    for key, value in rows.items():
        text = escape(value if isinstance(value, str) else short(value, 200))
        style = status_style(text) if key == "status" else ""
        table.add_row(key, f"[{style}]{text}[/]" if style else text)
    return table


def rows_table(title: str, rows: list[Any]) -> Table:
    """A collection (or any list of objects) as a table with one column per field."""
    table = Table(title=title, title_justify="left")
    data = [plain(r) for r in rows]
    columns = list(dict.fromkeys(k for r in data if isinstance(r, dict) for k in r))
    if not columns:
        table.add_column("value", overflow="fold")
        for r in data:
            table.add_row(escape(short(r, 200)))
        return table
    for column in columns:
        table.add_column(column, overflow="fold")
    for r in data:
        table.add_row(
            *(escape(short(r.get(c, ""), 120)) if isinstance(r, dict) else "" for c in columns)
        )
    return table


def actions_table(actions: list[ActionRequested]) -> Table:
    table = Table(title="Pending actions", title_justify="left")
    for column in ("tool call", "tool", "waits for", "input", "may answer"):
        table.add_column(column, overflow="fold")
    for a in actions:
        table.add_row(
            a.tool_call_id,
            a.tool,
            "[yellow]approval[/]" if a.kind == "approval" else "[cyan]client[/]",
            escape(short(a.input, 120)),
            escape(short(a.authorized) if a.authorized else "anyone"),
        )
    return table


def event_line(record: LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord) -> str:
    """One line of ``wakeful tail``: id, kind, fields (as Rich markup)."""
    if isinstance(record, TrimmedRecord):
        return f"[dim]{record.id}[/]  [bold yellow]{'TRIMMED':<16}[/] {escape(record.message)}"
    if isinstance(record, UndecodableRecord):
        return f"[dim]{record.id}[/]  [bold red]UNDECODABLE[/]  {escape(record.error)}"
    if isinstance(record, LiveRecord):
        detail = record.event.data if record.event.kind == "text" else plain(record.event)
        return f"[dim]{record.id}[/]  [magenta]{'live':<16}[/] {escape(short(detail, 160))}"
    data = plain(record.event)
    kind = data.pop("t", "?")
    data.pop("v", None)
    style = "red" if kind in ("failed", "handler_error", "delivery_failed") else "cyan"
    return (
        f"[dim]{record.id}[/]  [{style}]{kind:<16}[/] "
        f"{escape(json.dumps(data, default=str, ensure_ascii=False))}"
    )


class ReplyPrinter:
    """Draws ``wakeful ask``: the agent's text on stdout, activity on stderr.

    On a terminal the text is streamed from live deltas. Piped, stdout gets only
    the durable text of each step, so it is an exact copy of the reply even when
    a step was retried after a model error (its deltas then repeat).
    """

    def __init__(self, *, stream: bool | None = None) -> None:
        self.stream = out.is_terminal if stream is None else stream
        # (run id, step) -> the text streamed for it so far
        self.streamed: dict[tuple[str | None, int | None], str] = {}
        self.text_step: tuple[str | None, int | None] | None = None  # step being printed
        self.printed_text = False  # the current run printed agent text
        self.at_line_start = True
        self.last_run: RunFinished | None = None
        self.failure: str | None = None

    def handle(self, record: LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord) -> None:
        if isinstance(record, LiveRecord):
            self._live(record)
        elif isinstance(record, TrimmedRecord):
            self._note(f"[yellow]{escape(record.message)}[/]")
        elif isinstance(record, UndecodableRecord):
            self._note(f"[red]event {record.id} could not be decoded: {escape(record.error)}[/]")
        else:
            self._event(record.event)

    def _text(self, text: str) -> None:
        out.print(text, end="", markup=False)
        self.at_line_start = text.endswith("\n")
        self.printed_text = True

    def _end_line(self) -> None:
        if not self.at_line_start:
            out.print()
            self.at_line_start = True

    def _note(self, markup: str) -> None:
        self._end_line()
        err.print(markup)

    def _live(self, record: LiveRecord) -> None:
        event = record.event
        if event.kind == "text":
            if not self.stream:
                return
            step = (event.run_id, event.step)
            if step != self.text_step:
                self._end_line()
                self.text_step = step
            self.streamed[step] = self.streamed.get(step, "") + str(event.data)
            self._text(str(event.data))
        elif event.kind == "tool_data":
            return  # the durable tool_data event is printed when it comes
        else:
            self._note(
                f"[dim]  … {escape(record.event.tool or '')}: {escape(short(record.event.data))}[/]"
            )

    def _event(self, event: Any) -> None:
        if isinstance(event, RunStarted):
            self.printed_text = False
        elif isinstance(event, AssistantStep):
            text = "".join(b.get("text", "") for b in event.content if b.get("type") == "text")
            step = (event.run_id, event.step)
            streamed = self.streamed.pop(step, None)
            if step == self.text_step:  # its deltas are printed: end their line
                self._end_line()
                self.text_step = None
            if streamed is not None and streamed != text:
                self._note("[dim](the step was retried; what it finally said:)[/]")
                streamed = None
            if text and streamed is None:
                self._end_line()
                self._text(text)
                self._end_line()
        elif isinstance(event, ToolIntent):
            for call in event.calls:
                self._note(f"[dim]⚙ {escape(call.name)} {escape(short(call.input))}[/]")
        elif isinstance(event, ToolOutcome):
            text = "".join(b.get("text", "") for b in event.content if b.get("type") == "text")
            mark = "[red]  ✗" if event.is_error else "[green]  ✓"
            self._note(f"{mark} {escape(short(text))}[/]")
        elif isinstance(event, ActionRequested):
            waits = "approval" if event.kind == "approval" else "the client"
            if event.refused:
                self._note(f"[yellow]  {escape(event.refused)}[/]")
            self._note(
                f"[yellow]⏸ {escape(event.tool)} {escape(short(event.input))} waits for {waits} "
                f"(tool call {event.tool_call_id})[/]"
            )
        elif isinstance(event, ActionSettled):
            by = f" by {short(event.by)}" if event.by else ""
            self._note(f"[dim]  {event.decision}{escape(by)}[/]")
        elif isinstance(event, RuntimeErrorRecorded):  # operators only: full in --json
            last = event.detail.strip().splitlines()[-1:] or [""]
            self._note(f"[red]  runtime error: {escape(event.error)}: {escape(last[0])}[/]")
        elif isinstance(event, ToolData):
            by = f" (by {short(event.by)})" if event.by else ""
            self._note(
                f"[dim]  ▤ tool data of {escape(event.tool_call_id)}{escape(by)}: "
                f"{escape(short(event.data))}[/]"
            )
        elif isinstance(event, ChildRunFinished):
            self._note(f"[dim]↩ {escape(event.child)} {event.status}[/]")
        elif isinstance(event, RunFinished):
            self.last_run = event
            answered = event.status in ("completed", "truncated", "refused")
            if answered and event.response and not self.printed_text:
                self._text(event.response)
            self._end_line()
            if event.status != "completed":
                self._note(f"[red]run {event.status}: {escape(event.error or '')}[/]")
        elif isinstance(event, HandlerFailed):
            self._note(
                f"[red]handler error (attempt {event.attempt}): "
                f"{escape(event.error_type)}: {escape(event.error)}[/]"
            )
        elif isinstance(event, EntityFailed):
            self.failure = event.error
            self._note(
                f"[bold red]entity failed after {event.attempts} attempts: {escape(event.error)}[/]"
            )

    def finish(self) -> None:
        self._end_line()
