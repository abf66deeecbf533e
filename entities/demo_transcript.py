"""How the demo prints: plain lines, wrapped, and an agent's journal as a transcript."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from wakeful import Runtime
from wakeful.events import AssistantStep, LogRecord, RunFinished, ToolOutcome, UserTurn


def say(text: str = "", end: str = "\n") -> None:
    print(text, end=end, flush=True)


def paragraph(text: str, indent: str = "   ", width: int = 96) -> None:
    """``text`` filled to ``width`` columns, every line indented."""
    say(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent))


async def journal(rt: Runtime, url: str) -> list[Any]:
    """The agent journal of ``url`` (and its finished runs), in log order."""
    kinds = (UserTurn, AssistantStep, ToolOutcome, RunFinished)
    return [
        r.event
        async for r in rt.events(url)
        if isinstance(r, LogRecord) and isinstance(r.event, kinds)
    ]


async def print_journal(rt: Runtime, url: str, skip: int, indent: str) -> int:
    """Print the journal of ``url`` after its first ``skip`` entries; return how many there are.

    After a run that dispatched children, the children's runs are printed
    (indented) before the parent's next run, which is where they happened.
    """
    events = await journal(rt, url)
    me = url.split("/")[1] + ":"
    dispatched: list[str] = []
    for event in events[skip:]:
        if isinstance(event, UserTurn):
            for block in event.content:
                text = block.get("text", "")
                if text.startswith("[message from"):
                    wrapped(indent, "message:", text)
                else:
                    wrapped(indent, "wake:" if text.startswith("[/") else "user:", text)
        elif isinstance(event, AssistantStep):
            for block in event.content:
                if block.get("type") == "text" and block["text"].strip():
                    wrapped(indent, me, block["text"])
                elif block.get("type") == "tool_use":
                    wrapped(indent, "  calls", f"{block['name']} {brief(block.get('input'))}")
        elif isinstance(event, ToolOutcome):
            text = "".join(b.get("text", "") for b in event.content)
            wrapped(indent, "  error" if event.is_error else "  result", text)
            spawned = event.name in ("spawn_agent", "dispatch")  # "dispatch" in older logs
            if spawned and isinstance(event.details, dict):
                dispatched.append(event.details["child"])
        elif isinstance(event, RunFinished):
            say(
                f"{indent}(run finished: {event.status}, {count(event.steps, 'model step')}, "
                f"{count(event.tool_calls, 'tool call')})"
            )
            for child in dispatched:
                status = await rt.status(child)
                say(f"{indent}| meanwhile {child} (type {status.type}, parent {status.parent}):")
                await print_journal(rt, child, 0, indent + "|   ")
            dispatched = []
    return len(events)


def brief(arguments: Any, limit: int = 60) -> str:
    """Tool arguments as JSON, long strings cut (the full text is shown where it arrives)."""
    if isinstance(arguments, dict):
        arguments = {
            k: v[:limit] + "..." if isinstance(v, str) and len(v) > limit else v
            for k, v in arguments.items()
        }
    return json.dumps(arguments, ensure_ascii=False)


def count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def wrapped(indent: str, label: str, text: str, width: int = 100) -> None:
    """``label`` then ``text``, wrapped, continuation lines aligned under the text."""
    first = f"{indent}{label:<12}"
    pad = indent + " " * 12
    out = []
    for n, line in enumerate(text.splitlines() or [""]):
        start = first if n == 0 else pad
        out.append(textwrap.fill(line, width, initial_indent=start, subsequent_indent=pad) or start)
    say("\n".join(out))
