"""The ``wakeful`` command's messages and logs: ``send``, ``ask``, ``tail``, ``export``.

What goes into an entity (a message, its attached files) and what comes out of it
(its log as a transcript or JSON, followed live, or exported as JSON Lines).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import redis.exceptions

from . import terminal, transcript
from .cli_connect import client_of
from .cli_parser import OK
from .cli_reply import follow_reply, identity_of
from .connection import AUTHENTICATION_ERRORS
from .content_blocks import attachment
from .errors import OutputError, WakefulError
from .events import LogRecord, TrimmedRecord
from .live import LiveRecord
from .redaction import redact
from .retention import json_lines
from .streamids import check_position
from .terminal import err, out


def _message(args: argparse.Namespace) -> dict[str, Any]:
    """The message ``send`` and ``ask`` send: the text and the attached files as
    content blocks, each checked before anything is sent (a bad file is named)."""
    files = args.files or []
    if args.text is None and not files:
        raise WakefulError("give the message's text, or attach a file with --file PATH")
    content = [attachment(path) for path in files] or None
    return {
        "payload": args.text if args.text is not None or content is None else None,
        "content": content,
        "idempotency_key": args.idempotency_key,
        "identity": identity_of(args),
    }


async def send(args: argparse.Namespace) -> int:
    message = _message(args)
    rt = await client_of(args)
    try:
        event_id = await rt.send(args.url, **message)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json({"url": args.url, "event_id": event_id})
    else:
        out.print(f"sent to {args.url}: {event_id}")
    return OK


async def ask(args: argparse.Namespace) -> int:
    message = _message(args)
    rt = await client_of(args)
    try:
        live_after = await rt.live_position(args.url)
        sent = await rt.send(args.url, **message)
        return await follow_reply(rt, args, after=sent, live_after=live_after)
    finally:
        await rt.close()


async def tail(args: argparse.Namespace) -> int:
    check_position(args.after, "--after")  # before connecting
    rt = await client_of(args)
    try:
        await rt.status(args.url)  # a clear error for a missing entity
        live_after = await rt.live_position(args.url) if args.live else None
        while True:
            try:
                async for record in rt.events(
                    args.url,
                    after=args.after,
                    follow=args.follow,
                    live=args.live,
                    live_after=live_after,
                ):
                    if isinstance(record, LiveRecord):
                        live_after = record.id
                    else:
                        args.after = record.id  # where to resume
                    if args.json:
                        print(
                            msgspec.json.encode(terminal.plain(_record(record))).decode(),
                            flush=True,
                        )
                    else:
                        for line in transcript.lines(record):
                            out.print(line)
                return OK
            except redis.exceptions.ConnectionError as exc:
                if not args.follow or isinstance(exc, AUTHENTICATION_ERRORS):
                    raise  # refused credentials: following on would only repeat them
                lost = terminal.escape(redact(str(exc)))
                err.print(f"[yellow]connection lost ({lost}); resuming after {args.after}[/]")
                await asyncio.sleep(1)
    finally:
        await rt.close()


async def export(args: argparse.Namespace) -> int:
    """``wakeful export URL``: the entity's current log as JSON Lines (stdout or a file)."""
    rt = await client_of(args)
    try:
        await rt.status(args.url)  # a clear error for a missing entity
        lines = 0
        with output(args.output) as write:
            async for record in rt.export_log(args.url):
                write(json_lines([record]))
                lines += 1
    finally:
        await rt.close()
    if args.output:
        err.print(f"wrote {lines} entries of {args.url} to {args.output}", markup=False)
    return OK


@contextlib.contextmanager
def output(path: str | None) -> Iterator[Callable[[str], object]]:
    """A ``write(text)`` to the file ``path`` (stdout if None), closed at the end.

    A file that cannot be opened, written or closed (a directory, a missing folder, no
    permission, a full disk) is a :class:`WakefulError` naming it, not a traceback. Only
    the file's own calls are guarded: an OSError of the caller's block passes unchanged."""
    if path is None:
        yield sys.stdout.write
        sys.stdout.flush()
        return

    def cannot_write(exc: OSError) -> OutputError:
        return OutputError(f"cannot write {path}: {exc.strerror or exc}")

    try:
        sink = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise cannot_write(exc) from None

    def write(text: str) -> None:
        try:
            sink.write(text)
        except OSError as exc:
            raise cannot_write(exc) from None

    try:
        yield write
    except BaseException:
        with contextlib.suppress(OSError):
            sink.close()
        raise
    try:
        sink.close()  # the last write: a full disk may show only here
    except OSError as exc:
        raise cannot_write(exc) from None


def _record(record: Any) -> dict[str, Any]:
    if isinstance(record, LiveRecord):
        return {"id": record.id, "live": record.event}
    if isinstance(record, LogRecord):
        return {"id": record.id, "event": record.event}
    if isinstance(record, TrimmedRecord):
        return {"id": record.id, "trimmed": record.message}
    return {"id": record.id, "error": record.error}
