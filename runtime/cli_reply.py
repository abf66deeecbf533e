"""Following a reply on the command line (``wakeful ask``, ``approve --follow``).

Streams what the entity does until it is idle, answers approvals at a terminal
prompt, and turns the outcome into the command's exit code and output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from . import terminal
from .actions import ActionNotPendingError
from .cli_parser import ERROR, OK, REFUSED, RUN_FAILED, SUSPENDED, TIMED_OUT, TRUNCATED
from .client import Runtime
from .errors import WaitTimeoutError, WakefulError
from .events import LogRecord
from .live import LiveRecord
from .terminal import err


def identity_of(args: argparse.Namespace) -> dict[str, str] | None:
    """The trusted identity from ``--identity KEY=VALUE`` flags (None without any)."""
    pairs = getattr(args, "identity", None) or []
    identity: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise WakefulError(f"--identity {pair!r} must be KEY=VALUE")
        if key in identity:  # the last one winning would act as someone unintended
            raise WakefulError(
                f"--identity gives {key!r} twice ({identity[key]!r} and {value!r}): give it once"
            )
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
    return ask_result(
        args,
        run.status,
        exit_code(run.status),
        response=run.response,
        error=run.error,
        stop_reason=run.stop_reason,
    )


def exit_code(status: str) -> int:
    """The exit code of ``ask`` for a run that finished with ``status``."""
    return {"completed": OK, "truncated": TRUNCATED, "refused": REFUSED}.get(status, RUN_FAILED)


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
            if await _confirm(question):
                await rt.approve(args.url, action.tool_call_id, identity=identity)
            else:
                reason = await _ask("reason", default="denied by the operator")
                await rt.deny(args.url, action.tool_call_id, reason, identity=identity)
        except ActionNotPendingError:
            err.print(f"[dim]{action.tool_call_id} was answered meanwhile[/]")
        answered = True
    return answered


class PromptInterrupted(Exception):
    """Ctrl-C at an approval prompt: the command ends with exit code 130."""


async def _confirm(question: str) -> bool:
    """A yes/no question at the terminal, asked until it gets one of them."""
    while True:
        # "\\[" is Rich's escape: the hint shows as "[y/n]", not read as a markup tag
        answer = (await _ask(f"{question} [bold magenta]\\[y/n][/]")).lower()
        if answer in ("y", "yes", "n", "no"):
            return answer.startswith("y")
        err.print("[red]please answer y or n[/]")


async def _ask(question: str, *, default: str = "") -> str:
    """Print ``question`` and wait for a line on the terminal, inside the event loop.

    The wait is an ``await``, so Ctrl-C (asyncio's handler cancels the main task) ends it
    at once, also when it came just before the prompt, and comes out as
    :class:`PromptInterrupted`, an ordinary exception: the command closes its client and
    exits 130. A blocking ``input()`` would leave the signal to Python's handler, which
    a read blocked in C may never run. A Ctrl-C whose cancellation an earlier await
    swallowed (redis-py on Python 3.11: see ``following._stop_if_cancelled``) is still
    pending on the task: it ends the prompt before it waits."""
    suffix = f" [dim]({terminal.escape(default)})[/]" if default else ""
    err.print(f"{question}{suffix}: ", end="")
    task = asyncio.current_task()
    try:
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        line = await _read_line(sys.stdin.fileno())
    except asyncio.CancelledError:
        if task is not None:
            task.uncancel()
        err.print()
        raise PromptInterrupted from None
    if line is None:  # end of input (Ctrl-D)
        err.print()
        raise PromptInterrupted
    return line.strip() or default


async def _read_line(fd: int) -> str | None:
    """One line from the terminal ``fd`` (canonical mode: a read returns one line);
    None at end of input."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    data = os.read(fd, 65536)
    return data.decode(errors="replace") if data else None


def ask_result(
    args: argparse.Namespace,
    status: str,
    code: int,
    *,
    response: str | None = None,
    error: str | None = None,
    pending: list[Any] | None = None,
    stop_reason: str | None = None,
) -> int:
    if args.json:
        terminal.print_json(
            {
                "url": args.url,
                "status": status,
                "response": response,
                "error": error,
                "stop_reason": stop_reason,
                "pending_actions": pending or [],
            }
        )
    elif code not in (OK, SUSPENDED):
        err.print(f"[red]{status}[/]" + (f": {terminal.escape(error)}" if error else ""))
    return code
