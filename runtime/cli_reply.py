"""Following a reply on the command line (``wakeful ask``, ``approve --follow``).

Streams what the entity does until it is idle, answers approvals at a terminal
prompt, and turns the outcome into the command's exit code and output.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from . import terminal
from .actions import ActionNotPendingError
from .cli_parser import ERROR, OK, RUN_FAILED, SUSPENDED, TIMED_OUT
from .client import Runtime
from .errors import WaitTimeoutError, WakefulError
from .events import LogRecord
from .live import LiveRecord
from .terminal import err


def identity_of(args: argparse.Namespace) -> dict[str, str] | None:
    """The trusted identity from ``--identity KEY=VALUE`` flags (None without any)."""
    pairs = getattr(args, "identity", None) or []
    identity = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise WakefulError(f"--identity {pair!r} must be KEY=VALUE")
        identity[key] = value
    return identity or None


async def follow_reply(
    rt: Runtime, args: argparse.Namespace, *, after: str, live_after: str
) -> int:
    """Stream what the entity does until it is idle; answer approvals on a terminal."""
    printer = terminal.ReplyPrinter()
    while True:
        try:
            after, live_after = await _stream(rt, args, printer, after, live_after)
        except WaitTimeoutError as exc:
            printer.finish()
            return ask_result(args, "timed out", TIMED_OUT, error=str(exc))
        printer.finish()
        status = await rt.status(args.url)
        if status.status == "failed":
            return ask_result(args, "failed", RUN_FAILED, error=status.error)
        if not status.pending_actions:
            break
        pending = await rt.pending_actions(args.url)
        if not await _answer_interactively(rt, args, pending):
            if not args.json:
                err.print(terminal.actions_table(pending))
                err.print(
                    f"[yellow]the run is suspended; answer with "
                    f"`wakeful approve {args.url} CALL` or `wakeful deny {args.url} CALL`[/]"
                )
            return ask_result(args, "suspended", SUSPENDED, pending=pending)
    run = printer.last_run
    if run is None:
        return ask_result(args, "no run", ERROR, error="no run finished after the message")
    code = OK if run.status == "completed" else RUN_FAILED
    return ask_result(args, run.status, code, response=run.response, error=run.error)


async def _stream(
    rt: Runtime,
    args: argparse.Namespace,
    printer: terminal.ReplyPrinter,
    after: str,
    live_after: str,
) -> tuple[str, str]:
    waiting = None if args.json else err.status(f"waiting for {args.url}", spinner="dots")
    if waiting is not None:
        waiting.start()
    records = rt.stream_until_idle(
        args.url, after=after, live_after=live_after, timeout=args.timeout
    )
    try:
        async for record in records:
            if waiting is not None:
                waiting.stop()
                waiting = None
            if isinstance(record, LiveRecord):
                live_after = record.id
            else:
                after = record.id
            if args.json:
                if isinstance(record, LogRecord):
                    printer.last_run = _run_of(record) or printer.last_run
            else:
                printer.handle(record)
    finally:
        await records.aclose()
        if waiting is not None:
            waiting.stop()
    return after, live_after


def _run_of(record: LogRecord) -> Any:
    from .events import RunFinished

    return record.event if isinstance(record.event, RunFinished) else None


async def _answer_interactively(rt: Runtime, args: argparse.Namespace, pending: list[Any]) -> bool:
    """Ask the operator about each pending approval; True if any answer was given (or
    someone else answered first), so the run goes on and is followed further."""
    if args.json or args.no_input or not sys.stdin.isatty():
        return False
    from rich.prompt import Confirm, Prompt

    answered = False
    identity = identity_of(args)
    # Only the calls this identity may answer (a run of another's is not ours to approve).
    mine = [a for a in pending if a.kind == "approval" and rt.action_authorizer(a, identity)]
    for action in mine:
        question = (
            f"[yellow]approve[/] {terminal.escape(action.tool)} "
            f"{terminal.escape(terminal.short(action.input))} ([dim]{action.tool_call_id}[/])?"
        )
        try:
            if _prompt(Confirm.ask, question, console=err):
                await rt.approve(args.url, action.tool_call_id, identity=identity)
            else:
                reason = _prompt(
                    Prompt.ask, "reason", console=err, default="denied by the operator"
                )
                await rt.deny(args.url, action.tool_call_id, reason, identity=identity)
        except ActionNotPendingError:
            err.print(f"[dim]{action.tool_call_id} was answered meanwhile[/]")
        answered = True
    return answered


class PromptInterrupted(Exception):
    """Ctrl-C at an approval prompt: the command ends with exit code 130."""


def _prompt(ask: Any, *args: Any, **kwargs: Any) -> Any:
    """Prompt in the main thread with Python's own Ctrl-C handling (asyncio's handler
    only cancels the main task, which a blocking ``input()`` never notices).

    Ctrl-C comes out as :class:`PromptInterrupted`, an ordinary exception: a
    ``KeyboardInterrupt`` raised inside a task escapes the event loop at once, past the
    ``finally`` blocks that close the client, and its teardown could hang."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # A Ctrl-C that came before the swap only asked asyncio to cancel this task, which
        # a blocking input() would never see: it is the operator's answer, so stop here.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise PromptInterrupted
        return ask(*args, **kwargs)
    except KeyboardInterrupt:
        raise PromptInterrupted from None
    finally:
        signal.signal(signal.SIGINT, previous)


def ask_result(
    args: argparse.Namespace,
    status: str,
    code: int,
    *,
    response: str | None = None,
    error: str | None = None,
    pending: list[Any] | None = None,
) -> int:
    if args.json:
        terminal.print_json(
            {
                "url": args.url,
                "status": status,
                "response": response,
                "error": error,
                "pending_actions": pending or [],
            }
        )
    elif code not in (OK, SUSPENDED):
        err.print(f"[red]{status}[/]" + (f": {terminal.escape(error)}" if error else ""))
    return code
