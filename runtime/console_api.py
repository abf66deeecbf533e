"""The console's operator reads, mounted by the gateway (``gateway.py``).

    GET /entities                               every entity the caller may read, across
                                                types, with its status and lag (?status=,
                                                ?type=, ?q=<part of the url>, ?limit=,
                                                ?after=<last url>)
    GET /entities/{type}/{id}/overview          status (with runs), lag, the entity's
                                                partition and the live worker serving it
    GET /entities/{type}/{id}/journal           the log, every event decoded, with its time
                                                (?after=<entry id>, ?limit=)
    GET /entities/{type}/{id}/tree              the children, their children, ... with each
                                                one's status (?depth=)

They are authorised as the gateway's other reads are (``authorization.py``): a
listing holds only the entities the caller may read, an entity's views need a
read of it, and a child the caller may not read is named in the tree but not
opened. The gateway has no operator identity, so the journal is what every HTTP
client may see (:func:`~wakeful.events.client_view`): errors redacted, no
tracebacks, no operator-only events (it counts those it leaves out, and the
console says where to find them: ``wakeful tail``, ``rt.runtime_errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .authorization import Access, Authorizer, EntityAccess, allowed, readable
from .client import Runtime
from .errors import EntityNotFoundError, HTTPError, InvalidUrlError
from .events import HandlerFailed, LogRecord, TrimmedRecord, UndecodableRecord, client_view, plain
from .http_input import query_int, query_url, resume_position
from .openapi import CONSOLE_PAGE, JOURNAL_PAGE, TREE_DEPTH
from .status import STATUSES, EntityStatus
from .streamids import id_gt, is_stream_id
from .urls import ID_MAX, parse_url, validate_type_name

Identity = dict[str, str]
Handler = Callable[[Request], Awaitable[Response]]

SCAN_LIMIT = 2000  # most entities one request reads the status of (the rest: ?after=next)
TREE_NODES = 500  # children the tree holds at most
READS_AT_ONCE = 16  # status reads in flight for one listing


@dataclasses.dataclass(frozen=True)
class GatewayParts:
    """What the routes take from the gateway that mounts them: its runtime and policy,
    how it authenticates a caller and authorises an entity read, how it turns an
    endpoint's errors into JSON, and its JSON response."""

    runtime: Runtime
    policy: Authorizer
    caller: Callable[[Request], Awaitable[Identity | None]]
    entity: Callable[[Request, Access], Awaitable[tuple[str, Identity | None]]]
    endpoint: Callable[[Handler], Handler]
    respond: Callable[[Any], Response]


def routes(parts: GatewayParts) -> list[Route]:
    """The console's routes (see the module docstring)."""
    runtime, endpoint = parts.runtime, parts.endpoint
    base = "/entities/{type}/{id}"

    @endpoint
    async def listing(request: Request) -> Response:
        identity = await parts.caller(request)
        wanted = _statuses(request)
        type_name = request.query_params.get("type") or None
        if type_name is not None:
            validate_type_name(type_name)
        search = _text_query(request, "q")
        after = query_url(request, "after")
        limit = query_int(request, "limit", 50, 1, CONSOLE_PAGE)
        urls = await runtime.list(type_name)
        candidates = [u for u in urls if u > after and search in u]
        page, scanned = await _page(parts, identity, candidates, wanted, limit)
        more = bool(candidates) and scanned < len(candidates)
        return parts.respond(
            {
                "entities": page,
                "next": candidates[scanned - 1] if more and scanned else None,
                "statuses": list(STATUSES),
            }
        )

    @endpoint
    async def overview(request: Request) -> Response:
        url, _ = await parts.entity(request, "read")
        status = await runtime.status(url, runs=True)
        store = runtime.store
        assert store is not None  # a started runtime
        partition = store.keys.partition(url)
        owners = await runtime.partition_owners()
        live = await runtime.workers()
        return parts.respond(
            {
                **dataclasses.asdict(status),
                "lag": await _lag(runtime, status),
                "partition": partition,
                "served_by": owners.get(partition),
                "live_workers": len(live),
            }
        )

    @endpoint
    async def journal(request: Request) -> Response:
        url, _ = await parts.entity(request, "read")
        status = await runtime.status(url)  # 404 for a missing entity
        after, _ = resume_position(request)
        limit = query_int(request, "limit", 500, 1, JOURNAL_PAGE)
        entries: list[dict[str, Any]] = []
        hidden, last = 0, None
        records = runtime.events(url, after=after)
        async with contextlib.aclosing(records):
            async for record in records:
                last = record.id
                entry = _entry(record)
                if entry is None:
                    hidden += 1  # an operator-only event: never sent over HTTP
                else:
                    entries.append(entry)
                if len(entries) + hidden >= limit:
                    break
        more = last is not None and len(entries) + hidden >= limit
        return parts.respond(
            {
                "url": url,
                "status": status.status,
                "attempts": status.attempts,
                "error": status.error,
                "entries": entries,
                "hidden": hidden,
                "next": last if more else None,
            }
        )

    @endpoint
    async def tree(request: Request) -> Response:
        url, identity = await parts.entity(request, "read")
        depth = query_int(request, "depth", TREE_DEPTH, 1, TREE_DEPTH)
        status = await runtime.status(url, runs=True)
        walk = _TreeWalk(parts, identity)
        children = await walk.children(url, depth, {url})
        return parts.respond(
            {
                "url": url,
                "status": status.status,
                "run": _run(status),
                "children": children,
                "truncated": walk.truncated,
            }
        )

    return [
        Route("/entities", listing, methods=["GET"]),
        Route(base + "/overview", overview),
        Route(base + "/journal", journal),
        Route(base + "/tree", tree),
    ]


def _statuses(request: Request) -> set[str]:
    """``?status=failed,waiting``: the statuses asked for (all when none is given)."""
    raw = request.query_params.get("status", "")
    words = {w.strip() for w in raw.split(",") if w.strip()}
    unknown = sorted(words - set(STATUSES))
    if unknown:
        raise HTTPError(
            400,
            "BadQuery",
            f"status {', '.join(map(repr, unknown))} is not a status: use {', '.join(STATUSES)}",
        )
    return words or set(STATUSES)


def _text_query(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if len(value) > ID_MAX + 70:  # longer than any entity url
        raise HTTPError(400, "BadQuery", f"{name} is {len(value)} characters long, too long")
    return value


async def _page(
    parts: GatewayParts,
    identity: Identity | None,
    candidates: list[str],
    wanted: set[str],
    limit: int,
) -> tuple[list[dict[str, Any]], int]:
    """The first ``limit`` of ``candidates`` the caller may read whose status is
    ``wanted``, and how many candidates were looked at for them (at most SCAN_LIMIT)."""
    out: list[dict[str, Any]] = []
    scanned = 0
    batch = 100
    while scanned < len(candidates) and scanned < SCAN_LIMIT and len(out) < limit:
        chunk = candidates[scanned : scanned + min(batch, SCAN_LIMIT - scanned)]
        may = set(await readable(parts.policy, parts.runtime, identity, chunk, len(chunk)))
        rows = await _rows(parts.runtime, [u for u in chunk if u in may])
        for url in chunk:
            scanned += 1
            row = rows.get(url)
            if row is not None and row["status"] in wanted:
                out.append(row)
                if len(out) == limit:
                    break
    return out, scanned


async def _rows(runtime: Runtime, urls: list[str]) -> dict[str, dict[str, Any]]:
    """The listing row of each entity (one gone meanwhile has none)."""
    gate = asyncio.Semaphore(READS_AT_ONCE)
    rows: dict[str, dict[str, Any]] = {}
    statuses = await runtime.statuses(urls)  # one bulk read; then the lag where there is one

    async def read(url: str) -> None:
        status = statuses.get(url)
        if status is None:
            return
        async with gate:
            try:
                lag = await _lag(runtime, status)
            except EntityNotFoundError:
                return
        rows[url] = {
            "url": url,
            "type": status.type,
            "status": status.status,
            "attempts": status.attempts,
            "error": status.error,
            "parent": status.parent,
            "pending_actions": status.pending_actions,
            "lag": lag,
        }

    await asyncio.gather(*(read(url) for url in urls))
    return rows


async def _lag(runtime: Runtime, status: EntityStatus) -> dict[str, int]:
    """Inputs appended but not yet handled, and the age of the oldest (ms): read only
    when there are some (the last input is past the cursor)."""
    positions = (status.last_input, status.cursor)
    # corrupted positions are not compared: the row shows the entity failed, naming them
    if not (all(map(is_stream_id, positions)) and id_gt(*positions)):
        return {"inputs": 0, "ms": 0}
    inputs, age = await runtime.lag(status.url)
    return {"inputs": inputs, "ms": age}


def _entry(record: Any) -> dict[str, Any] | None:
    """One journal entry: ``{id, at_ms, kind, event}`` (None: an operator-only event)."""
    at_ms = int(record.id.split("-")[0])
    if isinstance(record, TrimmedRecord):
        return {"id": record.id, "at_ms": at_ms, "kind": "trimmed", "event": {"upto": record.id}}
    if isinstance(record, UndecodableRecord):
        return {"id": record.id, "at_ms": at_ms, "kind": "undecodable", "error": record.error}
    assert isinstance(record, LogRecord)
    event = client_view(record.event)
    if event is None:
        return None
    entry = {
        "id": record.id,
        "at_ms": at_ms,
        "kind": str(type(event).__struct_config__.tag),
        "event": plain(event),
    }
    if isinstance(record.event, HandlerFailed) and record.event.traceback:
        entry["traceback_withheld"] = True  # operators read it with `wakeful tail`
    return entry


def _run(status: EntityStatus) -> dict[str, Any] | None:
    run = status.run or status.last_run
    return None if run is None else dataclasses.asdict(run)


class _TreeWalk:
    """Children, depth first, each with its own status; a child the caller may not
    read is named but not opened, and the walk stops at TREE_NODES."""

    def __init__(self, parts: GatewayParts, identity: Identity | None) -> None:
        self.parts = parts
        self.identity = identity
        self.nodes = 0
        self.truncated = False

    async def children(self, url: str, depth: int, seen: set[str]) -> list[dict[str, Any]]:
        runtime = self.parts.runtime
        out: list[dict[str, Any]] = []
        try:
            children = await runtime.children(url)
        except EntityNotFoundError:  # deleted while the tree was read
            return out
        for child in children:
            if self.nodes >= TREE_NODES:
                self.truncated = True
                break
            self.nodes += 1
            node: dict[str, Any] = {
                "url": child.url,
                "type": child.type,
                "run": {"status": "running" if child.pending else child.status},
                "response": child.response,
                "run_error": child.error,
            }
            out.append(node)
            if not await self._readable(child.url):
                node["status"] = "not readable"
                continue
            try:
                status = await runtime.status(child.url)
            except (EntityNotFoundError, InvalidUrlError):
                node["status"] = "deleted"
                continue
            node["status"] = status.status
            node["error"] = status.error
            if child.url in seen:  # a child spawned again further down: drawn once
                continue
            if depth > 1:
                node["children"] = await self.children(child.url, depth - 1, seen | {child.url})
            elif await runtime.children(child.url):
                node["more"] = True  # deeper than ?depth=
                self.truncated = True
        return out

    async def _readable(self, url: str) -> bool:
        parse_url(url)
        exists, owner = await self.parts.runtime.ownership(url)
        access = EntityAccess(self.identity, url, "read", exists, owner)
        return await allowed(self.parts.policy, access)
