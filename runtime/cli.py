"""The ``wakeful`` command line.

    wakeful demo                         the demo: a worker killed mid-run, resumed (embedded)
    wakeful worker APP                   run a worker for the registry APP (module:attr)
    wakeful serve APP                    the HTTP gateway and web console
    wakeful send URL TEXT [--file PATH]  send a message (with attachments), print its event id
    wakeful ask URL TEXT [--file PATH]   send a message and stream the reply
    wakeful tail URL [-f] [--live]       the entity log as a transcript (and live output)
    wakeful export URL [-o FILE]         the entity's current log as JSON Lines
    wakeful create URL [--args JSON]     create an entity (cancel, delete: end it)
    wakeful state URL, history URL       its collections; its agent journal
    wakeful submit URL CALL OUTPUT       answer a client tool call (fail: fail it)
    wakeful inspect URL                  status, lease, lag, state, children, actions
    wakeful ls [TYPE]                    entities (of a type) and their status
    wakeful pending URL                  tool calls waiting for a client or an approval
    wakeful approve URL CALL             approve a pending call (deny: refuse it; skip: not
                                         run, the model gets a synthetic output)
    wakeful set-data URL CALL JSON       set the tool data of a pending call
    wakeful resume URL [--skip-failed]   un-park a failed entity
    wakeful schedules URL                recurring schedules (--set ID CRON, --delete ID)
    wakeful bad                          pointers and timers the workers moved aside
    wakeful compact URL | reset URL      shorten an agent's conversation (summary / none)
    wakeful manifest APP                 the registry's manifest as JSON

The connection comes from ``--redis`` or ``WAKEFUL_REDIS_URL``; every other
setting from ``WAKEFUL_*`` variables (see README). Tables and colours on a
terminal, plain text when piped, JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib
import logging
import os
import re
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import msgspec
import redis.exceptions

from . import cli_admin, terminal, transcript
from .cli_parser import BROKEN_PIPE, ERROR, INTERRUPTED, OK, UNREACHABLE, build_parser
from .cli_reply import PromptInterrupted, follow_reply, identity_of
from .cli_tokens import TOKENS_VAR, load_tokens
from .client import Runtime
from .config import Settings
from .connection import CLUSTER_SCHEMES
from .content_blocks import attachment
from .errors import EntityNotFoundError, RedisFullError, ReplicaWaitError, WakefulError
from .events import LogRecord, TrimmedRecord
from .json_values import decode_json
from .live import LiveRecord
from .redaction import RedactingFormatter, redact, redact_url, url_secrets
from .registry import Registry
from .retention import json_lines
from .status import EntityStatus
from .tasks import first_of
from .terminal import err, out

# Exit code 6 (UNREACHABLE): Redis did not answer, or a cluster is failing over or moving
# a slot (CLUSTERDOWN, MASTERDOWN, TRYAGAIN, a MOVED / ASK left over, no reachable node).
UNREACHABLE_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
CLUSTER_ERRORS = (
    redis.exceptions.ClusterError,  # ClusterDownError, MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # MovedError
    redis.exceptions.RedisClusterException,  # e.g. no seed node answers
)

_STREAM_ID = re.compile(r"\d+(-\d+)?")
Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def load_registry(spec: str) -> Registry:
    """Import ``module:attribute`` (attribute defaults to ``registry``), looking in the
    current directory first, as ``python -m`` and uvicorn do."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WakefulError(f"cannot import app module {module_name!r}: {exc}") from exc
    registry = getattr(module, attr or "registry", None)
    if not isinstance(registry, Registry):
        raise WakefulError(f"{spec!r} is not a Registry (expected module:attribute)")
    return registry


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env(redis_url=getattr(args, "redis", None))
    url = settings.redis_url
    schemes = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)
    if url is not None and not url.startswith(schemes):
        raise WakefulError(
            f"Redis URL {redact_url(url)!r} must start with redis://, rediss://, unix://, "
            "redis+cluster:// or rediss+cluster:// (from --redis or WAKEFUL_REDIS_URL)"
        )
    return settings


async def _client(args: argparse.Namespace) -> Runtime:
    registry = load_registry(args.app) if getattr(args, "app", None) else Registry()
    settings = _settings(args)
    if settings.redis_url is None:
        raise WakefulError(
            f"wakeful {args.command} needs a Redis: pass --redis or set WAKEFUL_REDIS_URL"
        )
    rt = Runtime(registry, settings=settings, run_worker=False)
    try:
        return await rt.start()
    except redis.exceptions.ConnectionError:
        await rt.close()
        raise


# -- processes ----------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    settings = _settings(args)
    if settings.redis_url is None:
        raise WakefulError("wakeful worker needs a Redis: pass --redis or set WAKEFUL_REDIS_URL")
    metrics_socket = cli_admin.listen(args.metrics_host, args.metrics_port)
    rt = Runtime(registry, settings=settings, run_worker=True)
    with err.status(f"starting a worker on {redact_url(settings.redis_url)}"):
        await rt.start()
    assert rt.worker is not None
    # Long-lived process: move start-up objects out of the collector's way; full
    # collections otherwise pause a busy worker for ~10 ms at a time.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {rt.worker.id} running {', '.join(registry.names())}", flush=True)
    # Until a signal, or until the worker dies on its own (rt.close() raises its error).
    async with cli_admin.metrics_server(rt, metrics_socket):
        await first_of(stop.wait(), rt.worker.stopped.wait())
    if stop.is_set():
        print("shutting down: finishing running wakes", flush=True)
    await rt.close()
    return OK


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .authorization import load_authorizer
    from .gateway import bearer_tokens, create_app
    from .http_limits import allowed_hosts, server_config

    authorize = load_authorizer(args.authorizer) if args.authorizer else None
    registry = load_registry(args.app)
    settings = _serve_settings(args)
    hosts = allowed_hosts(args.host, args.allowed_host or ())
    if args.token:
        err.print(
            "[yellow]warning: --token shows the token to every user of this machine (ps); "
            f"use --token-file or {TOKENS_VAR}[/]"
        )
    tokens = load_tokens(args.token, args.token_file)
    rt = Runtime(registry, settings=settings, run_worker=settings.redis_url is None or args.worker)
    await rt.start()
    app = create_app(
        rt,
        authenticate=bearer_tokens(tokens) if tokens else None,
        authorize=authorize,
        allowed_hosts=hosts,
    )
    server = uvicorn.Server(
        # log_config=None: uvicorn logs through the root logger, whose lines are redacted
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", log_config=None)
    )
    server = uvicorn.Server(server_config(app, host=args.host, port=args.port, settings=settings))
    base = f"http://{args.host}:{args.port}"
    policy = args.authorizer or ("owner" if tokens else "allow-all")
    print(
        f"serving {', '.join(registry.names())} on {base} "
        f"(console: {base}/console/; authorisation: {policy})",
        flush=True,
    )
    if hosts is None:
        print("answering to any Host name: pass --allowed-host NAME to restrict", flush=True)
    if rt.worker is None:
        live = await rt.workers()
        if live:
            print(
                f"no worker in this process; {len(live)} live worker(s) on "
                f"{redact_url(settings.redis_url or '')}",
                flush=True,
            )
        else:
            print(
                f"no worker runs on {redact_url(settings.redis_url or '')}: messages wait "
                "until one starts "
                "(`wakeful worker APP`, or serve with --worker)",
                flush=True,
            )
    try:
        await server.serve()
    finally:
        await rt.close()
    return OK


def _serve_settings(args: argparse.Namespace) -> Settings:
    """The settings with serve's limit flags over them (a flag left out keeps the setting)."""
    flags = {
        "max_body_bytes": args.max_body_bytes,
        "max_header_bytes": args.max_header_bytes,
        "max_headers": args.max_headers,
        "header_timeout_s": args.header_timeout,
        "keep_alive_s": args.keep_alive,
        "max_http_connections": args.max_connections,
    }
    return dataclasses.replace(_settings(args), **{k: v for k, v in flags.items() if v is not None})


async def _demo(args: argparse.Namespace) -> int:
    # The demo is an app like any other: loaded by name, so the library never imports
    # its own examples (wakeful.entities sits above every layer of the library).
    run_demo = importlib.import_module("wakeful.entities.demo").run_demo

    await run_demo()
    return OK


async def _manifest(args: argparse.Namespace) -> int:
    print(load_registry(args.app).manifest_json())
    return OK


# -- messages -----------------------------------------------------------------------


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


async def _send(args: argparse.Namespace) -> int:
    message = _message(args)
    rt = await _client(args)
    try:
        event_id = await rt.send(args.url, **message)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json({"url": args.url, "event_id": event_id})
    else:
        out.print(f"sent to {args.url}: {event_id}")
    return OK


async def _ask(args: argparse.Namespace) -> int:
    message = _message(args)
    rt = await _client(args)
    try:
        live_after = await rt.live_position(args.url)
        sent = await rt.send(args.url, **message)
        return await follow_reply(rt, args, after=sent, live_after=live_after)
    finally:
        await rt.close()


# -- reading ------------------------------------------------------------------------


async def _inspect(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        status = await rt.status(args.url, runs=True)
        lag_inputs, lag_ms = await rt.lag(args.url)
        info = {
            **dataclasses.asdict(status),
            "lease_owner": await rt.lease_owner(args.url),
            "worker": await _serving_worker(rt, args.url),
            "lag": {"inputs": lag_inputs, "oldest_ms": lag_ms},
            "state": await rt.state(args.url),
            "children": await rt.children(args.url),
            "pending_actions": await rt.pending_actions(args.url),
        }
    finally:
        await rt.close()
    if args.json:
        terminal.print_json(info)
        return OK
    state, children, pending = info.pop("state"), info.pop("children"), info.pop("pending_actions")
    info["lag"] = f"{lag_inputs} unhandled input(s), oldest {lag_ms} ms"
    for key in ("run", "last_run"):  # "<id> <status> <when>"
        if run := info[key]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["at_ms"] / 1000))
            info[key] = " ".join([run["id"], run["status"], *([when] if run["at_ms"] else [])])
    out.print(terminal.key_values(args.url, {k: v for k, v in info.items() if v not in (None, "")}))
    for name, rows in state.items():
        out.print(terminal.rows_table(f"Collection {name} ({len(rows)})", rows))
    if children:
        out.print(terminal.rows_table("Children", children))
    if pending:
        out.print(terminal.actions_table(pending))
    return OK


async def _serving_worker(rt: Runtime, url: str) -> str:
    """The live worker serving ``url``'s partition, or why none does."""
    partition = rt.store.keys.partition(url) if rt.store is not None else 0
    owner = await rt.partition_owner(partition)
    if owner is not None:
        return owner
    if not await rt.workers():
        return f"none: no worker runs (partition {partition}); start `wakeful worker APP`"
    return f"none: no live worker holds partition {partition} yet"


async def _ls(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        types = [args.type] if args.type else await rt.types()
        urls = [url for type_name in types for url in await rt.list(type_name)]
        statuses = []
        with err.status(f"reading {len(urls)} entities") if len(urls) > 100 else _nothing():
            for start in range(0, len(urls), 100):
                statuses += await _statuses(rt, urls[start : start + 100])
    finally:
        await rt.close()
    if args.json:
        terminal.print_json(
            [
                {"url": s.url, "status": s.status, "pending_actions": s.pending_actions}
                for s in statuses
            ]
        )
        return OK
    if not out.is_terminal:
        for s in statuses:
            print(f"{s.url}\t{s.status}")
        return OK
    table = terminal.Table(title=f"{len(statuses)} entities", title_justify="left")
    for column in ("url", "status", "pending actions", "error"):
        table.add_column(column, overflow="fold")
    for s in statuses:
        style = terminal.status_style(s.status)
        table.add_row(
            s.url,
            f"[{style}]{s.status}[/]",
            str(s.pending_actions or ""),
            terminal.escape(s.error or ""),
        )
    out.print(table)
    return OK


async def _statuses(rt: Runtime, urls: list[str]) -> list[EntityStatus]:
    """The status of each of ``urls``, in one bulk read; a missing entity is an error."""
    found = await rt.statuses(urls)
    for url in urls:
        if found.get(url) is None:
            raise EntityNotFoundError(url)
    return [status for url in urls if (status := found[url]) is not None]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def _tail(args: argparse.Namespace) -> int:
    if args.after is not None and not _STREAM_ID.fullmatch(args.after):
        raise WakefulError(f"--after {args.after!r} is not an event id (like 1700000000000-0)")
    rt = await _client(args)
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
                if not args.follow:
                    raise
                lost = terminal.escape(redact(str(exc)))
                err.print(f"[yellow]connection lost ({lost}); resuming after {args.after}[/]")
                await asyncio.sleep(1)
    finally:
        await rt.close()


async def _export(args: argparse.Namespace) -> int:
    """``wakeful export URL``: the entity's current log as JSON Lines (stdout or a file)."""
    rt = await _client(args)
    try:
        await rt.status(args.url)  # a clear error for a missing entity
        sink = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
        try:
            lines = 0
            async for record in rt.export_log(args.url):
                sink.write(json_lines([record]))
                lines += 1
            sink.flush()
        finally:
            if sink is not sys.stdout:
                sink.close()
    finally:
        await rt.close()
    if args.output:
        err.print(f"wrote {lines} entries of {args.url} to {args.output}", markup=False)
    return OK


def _record(record: Any) -> dict[str, Any]:
    if isinstance(record, LiveRecord):
        return {"id": record.id, "live": record.event}
    if isinstance(record, LogRecord):
        return {"id": record.id, "event": record.event}
    if isinstance(record, TrimmedRecord):
        return {"id": record.id, "trimmed": record.message}
    return {"id": record.id, "error": record.error}


async def _pending(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        await rt.status(args.url)
        pending = await rt.pending_actions(args.url)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json(pending)
    elif pending:
        out.print(terminal.actions_table(pending))
    else:
        out.print(f"{args.url} has no pending actions")
    return OK


# -- answers and operations ---------------------------------------------------------


async def _approve(args: argparse.Namespace) -> int:
    edited = None
    if args.input is not None:
        edited = decode_json(args.input, "--input")  # strict: no NaN, no deep nesting
    return await _decide(args, "approved", edited_input=edited)


async def _deny(args: argparse.Namespace) -> int:
    return await _decide(args, "denied")


async def _set_data(args: argparse.Namespace) -> int:
    try:
        data = msgspec.json.decode(args.data)
    except msgspec.DecodeError as exc:
        raise WakefulError(f"the tool data is not JSON: {exc}") from None
    rt = await _client(args)
    try:
        event_id = await rt.set_tool_data(args.url, args.call, data, identity=identity_of(args))
    finally:
        await rt.close()
    if args.json:
        terminal.print_json({"url": args.url, "tool_call_id": args.call, "event_id": event_id})
    else:
        out.print(f"tool data of {args.call} of {args.url}: {event_id}")
    return OK


async def _skip(args: argparse.Namespace) -> int:
    return await _decide(args, "skipped")


async def _decide(args: argparse.Namespace, decision: str, *, edited_input: Any = None) -> int:
    rt = await _client(args)
    try:
        live_after = await rt.live_position(args.url)
        identity = identity_of(args)
        if decision == "approved":
            event_id = await rt.approve(
                args.url, args.call, edited_input=edited_input, identity=identity
            )
        elif decision == "skipped":
            event_id = await rt.skip_action(args.url, args.call, args.reason, identity=identity)
        else:
            event_id = await rt.deny(args.url, args.call, args.reason, identity=identity)
        if not args.follow:
            if args.json:
                terminal.print_json(
                    {"url": args.url, "tool_call_id": args.call, "event_id": event_id}
                )
            else:
                out.print(f"{decision} {args.call} of {args.url}: {event_id}")
            return OK
        return await follow_reply(rt, args, after=event_id, live_after=live_after)
    finally:
        await rt.close()


async def _resume(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        skipped = await rt.resume(args.url, skip_failed=args.skip_failed)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json({"url": args.url, "resumed": True, "skipped": skipped})
    else:
        out.print(f"resumed {args.url}", markup=False)
        for input_id in skipped:
            out.print(f"skipped {input_id}", markup=False)
    return OK


async def _schedules(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        if args.set is not None:
            schedule_id, expression = args.set
            await rt.upsert_cron_schedule(
                args.url, schedule_id, expression, timezone=args.timezone, payload=args.payload
            )
        elif args.delete is not None and not await rt.delete_cron_schedule(args.url, args.delete):
            raise WakefulError(f"{args.url} has no schedule {args.delete!r}")
        schedules = await rt.cron_schedules(args.url)
    finally:
        await rt.close()
    rows = [
        {
            "id": s.id,
            "expression": s.expression,
            "timezone": s.timezone,
            "next": s.next_at.isoformat(timespec="seconds"),
            "payload": s.payload,
        }
        for s in schedules
    ]
    if args.json:
        terminal.print_json(rows)
    elif not rows:
        out.print(f"{args.url} has no recurring schedules", markup=False)
    elif not out.is_terminal:
        for row in rows:
            print("\t".join(terminal.short(row[k], 200) for k in row))
    else:
        out.print(terminal.rows_table(f"Recurring schedules of {args.url} ({len(rows)})", rows))
    return OK


async def _conversation(args: argparse.Namespace) -> int:
    """``compact`` and ``reset``: ask the entity's agent, wait until it is idle."""
    rt = await _client(args)
    try:
        if args.command == "compact":
            done = await rt.compact(args.url, timeout=args.timeout)
        else:
            done = await rt.reset_conversation(args.url, timeout=args.timeout)
    finally:
        await rt.close()
    verb = "compacted" if args.command == "compact" else "reset"
    if args.json:
        terminal.print_json({"url": args.url, verb: done})
    elif done:
        out.print(f"{verb} the conversation of {args.url}", markup=False)
    else:
        out.print(f"nothing to {args.command} in the conversation of {args.url}", markup=False)
    return OK


def _admin(command: Callable[[Runtime, argparse.Namespace], Awaitable[int]]) -> Command:
    """A command of cli_admin, given a connected client (closed after it)."""

    async def run(args: argparse.Namespace) -> int:
        rt = await _client(args)
        try:
            return await command(rt, args)
        finally:
            await rt.close()

    return run


COMMANDS: dict[str, Command] = {
    "demo": _demo,
    "worker": _worker,
    "serve": _serve,
    "send": _send,
    "ask": _ask,
    "tail": _tail,
    "export": _export,
    "inspect": _inspect,
    "ls": _ls,
    "workers": _admin(cli_admin.workers),
    "pending": _pending,
    "approve": _approve,
    "deny": _deny,
    "skip": _skip,
    "set-data": _set_data,
    "resume": _resume,
    "create": _admin(cli_admin.create),
    "cancel": _admin(cli_admin.cancel),
    "delete": _admin(cli_admin.delete),
    "state": _admin(cli_admin.state),
    "history": _admin(cli_admin.history),
    "submit": _admin(cli_admin.submit),
    "fail": _admin(cli_admin.fail),
    "bad": _admin(cli_admin.bad),
    "schedules": _schedules,
    "compact": _conversation,
    "reset": _conversation,
    "manifest": _manifest,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    redis_url = getattr(args, "redis", None) or os.environ.get("WAKEFUL_REDIS_URL") or ""
    secrets = url_secrets(redis_url)
    _log_redacted(logging.INFO if args.verbose else logging.WARNING, secrets)
    if getattr(args, "redis", None) and secrets:
        err.print(
            "[yellow]warning: --redis shows the Redis password to every user of this "
            "machine (ps); set WAKEFUL_REDIS_URL instead[/]"
        )

    def error(text: str) -> None:  # every error text passes the redaction
        err.print(f"[red]error:[/] {terminal.escape(redact(text, secrets))}")

    try:
        return asyncio.run(COMMANDS[args.command](args))
    except ReplicaWaitError as exc:  # written, not yet confirmed: worth a retry
        error(str(exc))
        return UNREACHABLE
    except WakefulError as exc:
        error(str(exc))
        return ERROR
    except UNREACHABLE_ERRORS as exc:
        error(f"cannot reach Redis at {redact_url(redis_url)}: {exc}")
        return UNREACHABLE
    except CLUSTER_ERRORS as exc:  # a failover or a slot migration under way
        error(f"the Redis Cluster at {redact_url(redis_url)} is not serving now: {exc}")
        return UNREACHABLE
    except redis.exceptions.OutOfMemoryError as exc:  # a plain command, not a script
        err.print(f"[red]error:[/] {terminal.escape(str(RedisFullError(str(exc))))}")
        return ERROR
    except redis.exceptions.RedisError as exc:
        error(f"Redis refused: {exc}")
        return ERROR
    except (KeyboardInterrupt, PromptInterrupted):
        if args.command == "tail" and args.after:
            hint = redact(_resume_command(argv, args.after), secrets)
            err.print(f"resume with: {hint}", markup=False)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (`wakeful tail ... | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
    except Exception:  # a bug: its traceback, redacted like every other line printed
        err.print(redact(traceback.format_exc(), secrets), markup=False, highlight=False)
        return ERROR


def _log_redacted(level: int, secrets: list[str]) -> None:
    """Log to stderr as ``logging.basicConfig`` would, every line redacted (a handler
    this set up before, in the same process, is replaced)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets)
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, RedactingFormatter)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def _resume_command(argv: Sequence[str] | None, after: str) -> str:
    """The same ``wakeful tail`` command line, continuing after ``after``."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--after" in words:
        at = words.index("--after")
        del words[at : at + 2]
    words = [w for w in words if not w.startswith("--after=")]
    return shlex.join(["wakeful", *words, "--after", after])


if __name__ == "__main__":
    sys.exit(main())
