"""The ``wakeful`` command's operator commands, and the worker's health and metrics port.

The everyday commands live beside it (``cli_messages``, ``cli_entities``); this module
holds those that look after the keyspace (workers, bad items) and act on an
entity as an operator (cancel, delete, create, state, history, submit/fail),
so that neither file grows past one screenful of concerns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from . import health, terminal, transcript
from .cli_parser import OK
from .cli_reply import identity_of
from .client import Runtime
from .errors import WakefulError
from .terminal import err, out
from .urls import parse_url


def listen(host: str, port: int | None) -> socket.socket | None:
    """The socket for ``--metrics-port`` (None without one), bound before the worker
    starts, so a port in use fails the command before it joins the keyspace."""
    return None if port is None else bind(host, port, "--metrics-port")


def bind(host: str, port: int, flag: str) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds one), for a server to listen on.

    A command binds it before it starts anything or prints its banner: a port in use (or
    a bad address) is an error naming ``flag``, and the command has done nothing yet."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:  # in use, not an address, not 0-65535
        sock.close()
        in_use = isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
        reason = f"port {port} is in use" if in_use else str(exc)
        raise WakefulError(f"{flag} {port}: cannot listen on {host}: {reason}") from None
    return sock


@asynccontextmanager
async def metrics_server(rt: Runtime, sock: socket.socket | None) -> AsyncIterator[None]:
    """Serve ``/healthz``, ``/readyz`` and ``/metrics`` on ``sock`` (None: nothing)."""
    if sock is None:
        yield
        return
    import uvicorn

    from .http_limits import logged_through_root

    logged_through_root()
    config = uvicorn.Config(health.app(rt), log_level="warning", lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="wakeful-metrics")
    host, port = sock.getsockname()[:2]
    print(f"metrics on http://{host}:{port}/metrics (and /healthz, /readyz)", flush=True)
    try:
        yield
    finally:
        server.should_exit = True
        await task
        sock.close()


# -- the keyspace ------------------------------------------------------------------


async def workers(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful workers``: live workers, their partitions, partitions without one."""
    live = await rt.workers()
    owners = await rt.partition_owners()
    unserved = [p for p, owner in owners.items() if owner is None]
    if args.json:
        terminal.print_json(
            {"workers": [dataclasses.asdict(w) for w in live], "unserved": unserved}
        )
        return OK
    if not live:
        err.print("[yellow]no worker runs: start `wakeful worker APP`[/]")
        out.print(f"no live worker; {len(unserved)} partition(s) without a worker")
        return OK
    rows = [
        {
            "worker": w.id,
            "partitions": ",".join(map(str, w.partitions)) or "-",
            "last heartbeat": f"{w.last_heartbeat_ms} ms ago",
        }
        for w in live
    ]
    out.print(terminal.rows_table(f"Workers ({len(live)})", rows))
    if unserved:
        out.print(f"partitions without a worker: {', '.join(map(str, unserved))}")
    else:
        out.print(f"every partition ({len(owners)}) has a worker")
    return OK


async def bad(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful bad``: wake pointers and timers the workers moved aside."""
    items = await rt.bad_items()
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


# -- acting on one entity ----------------------------------------------------------


def _json_arg(flag: str, text: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise WakefulError(f"{flag} is not JSON: {exc}") from None


def _done(args: argparse.Namespace, text: str, **data: Any) -> int:
    if args.json:
        terminal.print_json({"url": args.url, **data})
    else:
        out.print(text, markup=False)
    return OK


async def create(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful create URL [--args JSON] [--message TEXT]``: get-or-create an entity."""
    parsed = parse_url(args.url)
    entity_args = _json_arg("--args", args.args) if args.args is not None else None
    await rt.create(
        parsed.type,
        parsed.id,
        entity_args,
        initial_message=args.message,
        idempotency_key=args.idempotency_key,
        identity=identity_of(args),
    )
    return _done(args, f"created {args.url}", created=True)


async def cancel(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful cancel URL [--reason TEXT]``: cancel the current run (and children)."""
    event_id = await rt.cancel(args.url, args.reason)
    return _done(args, f"cancel sent to {args.url}: {event_id}", event_id=event_id)


async def delete(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful delete URL``: delete the entity; waits until a worker deleted it."""
    await rt.status(args.url)  # a clear error for a missing entity
    wait = not args.no_wait
    with err.status(f"deleting {args.url}") if wait else contextlib.nullcontext():
        await rt.delete(args.url, wait=wait, timeout=args.timeout)
    word = "deleted" if wait else "delete requested for"
    return _done(args, f"{word} {args.url}", deleted=wait)


async def state(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful state URL``: the committed collections."""
    await rt.status(args.url)
    collections = await rt.state(args.url)
    if args.json:
        terminal.print_json(collections)
        return OK
    if not collections:
        out.print(f"{args.url} has no rows in its collections", markup=False)
    for name, rows in collections.items():
        out.print(terminal.rows_table(f"Collection {name} ({len(rows)})", rows))
    return OK


async def history(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful history URL``: the agent journal, as a transcript (raw with --json)."""
    await rt.status(args.url)
    journal = await rt.history(args.url)
    if args.json:
        terminal.print_json([msgspec.to_builtins(e) for e in journal])
        return OK
    if not journal:
        out.print(f"{args.url} has no agent journal", markup=False)
    for line in transcript.history_lines(journal):
        out.print(line)
    return OK


async def submit(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful submit URL CALL OUTPUT``: answer a client tool call with its output."""
    output = _json_arg("OUTPUT", args.output)
    event_id = await rt.submit_tool_result(args.url, args.call, output, identity=identity_of(args))
    return _done(args, f"submitted {args.call} of {args.url}: {event_id}", event_id=event_id)


async def fail(rt: Runtime, args: argparse.Namespace) -> int:
    """``wakeful fail URL CALL [--error TEXT]``: fail a client tool call."""
    event_id = await rt.fail_action(args.url, args.call, args.error, identity=identity_of(args))
    return _done(args, f"failed {args.call} of {args.url}: {event_id}", event_id=event_id)
