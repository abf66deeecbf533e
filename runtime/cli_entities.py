"""The ``wakeful`` command's views and care of entities: ``inspect``, ``ls``,
``resume``, ``schedules``, ``compact`` and ``reset``.

Where an entity stands (status, lease, lag, state, children, pending actions), the
entities of a keyspace, and the operations an operator runs on one.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from . import terminal
from .cli_connect import client_of
from .cli_parser import OK
from .client import Runtime
from .errors import EntityNotFoundError, EventDecodeError, SnapshotError, WakefulError
from .status import EntityStatus
from .terminal import err, out


async def inspect(args: argparse.Namespace) -> int:
    rt = await client_of(args)
    try:
        status = await rt.status(args.url, runs=True)
        lag_inputs, lag_ms = await rt.lag(args.url)
        info: dict[str, Any] = {
            **dataclasses.asdict(status),
            "lease_owner": await rt.lease_owner(args.url),
            "worker": await _serving_worker(rt, args.url),
            "lag": {"inputs": lag_inputs, "oldest_ms": lag_ms},
        }
        try:
            info["state"] = await rt.state(args.url)
            info["children"] = await rt.children(args.url)
            info["pending_actions"] = await rt.pending_actions(args.url)
        except (SnapshotError, EventDecodeError) as exc:
            # A damaged snapshot or log entry: the status above says what it is (the
            # entity is failed, or will be at its next wake); show it, not a traceback.
            info["state_unreadable"] = str(exc)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json(info)
        return OK
    state = info.pop("state", {})
    children, pending = info.pop("children", []), info.pop("pending_actions", [])
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


async def ls(args: argparse.Namespace) -> int:
    rt = await client_of(args)
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


async def resume(args: argparse.Namespace) -> int:
    rt = await client_of(args)
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


async def schedules(args: argparse.Namespace) -> int:
    if args.set is None and (args.timezone is not None or args.payload is not None):
        # Given alone they would be ignored without a word: say what they belong to.
        raise WakefulError("--timezone and --payload describe the schedule of --set ID CRON")
    rt = await client_of(args)
    try:
        if args.set is not None:
            schedule_id, expression = args.set
            await rt.upsert_cron_schedule(
                args.url,
                schedule_id,
                expression,
                timezone=args.timezone or "UTC",
                payload=args.payload,
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


async def conversation(args: argparse.Namespace) -> int:
    """``compact`` and ``reset``: ask the entity's agent, wait until it is idle."""
    rt = await client_of(args)
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
