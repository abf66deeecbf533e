"""The ``wakeful`` command line.

    wakeful demo                         run the demo on the embedded default
    wakeful worker APP                   run a worker for the registry APP (module:attr)
    wakeful serve APP                    the HTTP gateway and web console
    wakeful send URL TEXT                send a message, print its event id
    wakeful ask URL TEXT                 send a message and stream the reply
    wakeful tail URL [-f] [--live]       the entity log (and live output), resumable
    wakeful inspect URL                  status, lease, lag, state, children, actions
    wakeful ls [TYPE]                    entities (of a type) and their status
    wakeful pending URL                  tool calls waiting for a client or an approval
    wakeful approve URL CALL             approve a pending call (deny: refuse it)
    wakeful resume URL [--skip-failed]   un-park a failed entity
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
from collections.abc import Sequence
from typing import Any

import msgspec
import redis.exceptions

from . import terminal
from .cli_parser import BROKEN_PIPE, ERROR, INTERRUPTED, OK, UNREACHABLE, build_parser
from .cli_reply import PromptInterrupted, follow_reply, identity_of
from .client import Runtime
from .config import Settings
from .errors import WakefulError
from .events import LogRecord
from .live import LiveRecord
from .registry import Registry
from .status import EntityStatus
from .tasks import first_error, first_of
from .terminal import err, out

_STREAM_ID = re.compile(r"\d+(-\d+)?")


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
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        raise WakefulError(
            f"Redis URL {url!r} must start with redis://, rediss:// or unix:// "
            "(from --redis or WAKEFUL_REDIS_URL)"
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
    rt = Runtime(registry, settings=settings, run_worker=True)
    with err.status(f"starting a worker on {settings.redis_url}"):
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
    await first_of(stop.wait(), rt.worker.stopped.wait())
    if stop.is_set():
        print("shutting down: finishing running wakes", flush=True)
    await rt.close()
    return OK


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .gateway import bearer_tokens, create_app

    registry = load_registry(args.app)
    settings = _settings(args)
    rt = Runtime(registry, settings=settings, run_worker=settings.redis_url is None or args.worker)
    await rt.start()
    tokens = {}
    for spec in args.token or []:
        user, sep, token = spec.partition("=")
        if not sep or not user or not token:
            raise WakefulError(f"--token {spec!r} must be USER=TOKEN")
        tokens[token] = {"user": user}
    app = create_app(rt, authenticate=bearer_tokens(tokens) if tokens else None)
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    )
    base = f"http://{args.host}:{args.port}"
    print(f"serving {', '.join(registry.names())} on {base} (console: {base}/console/)", flush=True)
    if rt.worker is None:
        live = await rt.workers()
        if live:
            print(
                f"no worker in this process; {len(live)} live worker(s) on {settings.redis_url}",
                flush=True,
            )
        else:
            print(
                f"no worker runs on {settings.redis_url}: messages wait until one starts "
                "(`wakeful worker APP`, or serve with --worker)",
                flush=True,
            )
    try:
        await server.serve()
    finally:
        await rt.close()
    return OK


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


async def _send(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        event_id = await rt.send(
            args.url, args.text, idempotency_key=args.idempotency_key, identity=identity_of(args)
        )
    finally:
        await rt.close()
    if args.json:
        terminal.print_json({"url": args.url, "event_id": event_id})
    else:
        out.print(f"sent to {args.url}: {event_id}")
    return OK


async def _ask(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        live_after = await rt.live_position(args.url)
        sent = await rt.send(
            args.url, args.text, idempotency_key=args.idempotency_key, identity=identity_of(args)
        )
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


async def _bad(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        items = await rt.bad_items()
    finally:
        await rt.close()
    if args.json:
        terminal.print_json(items)
    elif not items:
        out.print("no wake pointers or timers were moved aside")
    elif not out.is_terminal:
        for i in items:
            print("\t".join(i.get(k, "") for k in ("key", "kind", "item", "reason", "detail")))
    else:
        columns = ("key", "kind", "item", "reason", "detail", "worker")
        rows = [{k: i.get(k, "") for k in columns} for i in items]
        out.print(terminal.rows_table(f"Moved aside ({len(items)})", rows))
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


async def _workers(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        workers = await rt.workers()
        owners = await rt.partition_owners()
    finally:
        await rt.close()
    unserved = [p for p, owner in owners.items() if owner is None]
    if args.json:
        terminal.print_json(
            {"workers": [dataclasses.asdict(w) for w in workers], "unserved": unserved}
        )
        return OK
    if not workers:
        err.print("[yellow]no worker runs: start `wakeful worker APP`[/]")
        out.print(f"no live worker; {len(unserved)} partition(s) without a worker")
        return OK
    rows = [
        {
            "worker": w.id,
            "partitions": ",".join(map(str, w.partitions)) or "-",
            "last heartbeat": f"{w.last_heartbeat_ms} ms ago",
        }
        for w in workers
    ]
    out.print(terminal.rows_table(f"Workers ({len(workers)})", rows))
    if unserved:
        out.print(f"partitions without a worker: {', '.join(map(str, unserved))}")
    else:
        out.print(f"every partition ({len(owners)}) has a worker")
    return OK


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
    """The status of each of ``urls``, read concurrently; the first error is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            reads = [group.create_task(rt.status(url)) for url in urls]
    except ExceptionGroup as failed:
        raise first_error(failed) from None
    return [read.result() for read in reads]


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
                        out.print(terminal.event_line(record))
                return OK
            except redis.exceptions.ConnectionError as exc:
                if not args.follow:
                    raise
                err.print(f"[yellow]connection lost ({exc}); resuming after {args.after}[/]")
                await asyncio.sleep(1)
    finally:
        await rt.close()


def _record(record: Any) -> dict[str, Any]:
    if isinstance(record, LiveRecord):
        return {"id": record.id, "live": record.event}
    if isinstance(record, LogRecord):
        return {"id": record.id, "event": record.event}
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
        try:
            edited = msgspec.json.decode(args.input)
        except msgspec.DecodeError as exc:
            raise WakefulError(f"--input is not JSON: {exc}") from None
    return await _decide(args, "approved", edited_input=edited)


async def _deny(args: argparse.Namespace) -> int:
    return await _decide(args, "denied")


async def _decide(args: argparse.Namespace, decision: str, *, edited_input: Any = None) -> int:
    rt = await _client(args)
    try:
        live_after = await rt.live_position(args.url)
        identity = identity_of(args)
        if decision == "approved":
            event_id = await rt.approve(
                args.url, args.call, edited_input=edited_input, identity=identity
            )
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


COMMANDS = {
    "demo": _demo,
    "worker": _worker,
    "serve": _serve,
    "send": _send,
    "ask": _ask,
    "tail": _tail,
    "inspect": _inspect,
    "ls": _ls,
    "workers": _workers,
    "pending": _pending,
    "approve": _approve,
    "deny": _deny,
    "resume": _resume,
    "compact": _conversation,
    "reset": _conversation,
    "bad": _bad,
    "manifest": _manifest,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except WakefulError as exc:
        err.print(f"[red]error:[/] {terminal.escape(str(exc))}")
        return ERROR
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        url = _settings(args).redis_url
        err.print(f"[red]error:[/] cannot reach Redis at {url}: {terminal.escape(str(exc))}")
        return UNREACHABLE
    except redis.exceptions.RedisError as exc:
        err.print(f"[red]error:[/] Redis refused: {terminal.escape(str(exc))}")
        return ERROR
    except (KeyboardInterrupt, PromptInterrupted):
        if args.command == "tail" and args.after:
            err.print(f"resume with: {_resume_command(argv, args.after)}", markup=False)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (`wakeful tail ... | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE


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
