"""The HTTP gateway: entity URLs over HTTP (``wakeful serve APP``).

Routes (all JSON; errors are ``{"error": {"type", "message"}}`` with the
status code below):

    GET  /                                          the web console (static, /console/)
    GET  /manifest                                  the registry's contract
    GET  /openapi.json                              this API
    GET  /workers                                   live workers, their partitions, and the
                                                    partitions no live worker serves
    GET  /entities, .../{id}/overview, /journal, /tree  the console's operator reads
                                                    (console_api.py)
    GET  /entities/{type}                           urls of the type's entities the caller may
                                                    read, sorted (?limit=, ?after=<last url>)
    POST /entities/{type}/{id}                      create (get-or-create) {args, message}
    POST /entities/{type}/{id}/messages             send {payload, content, client_data, client_tools};
                                                    header Idempotency-Key
    GET  /entities/{type}/{id}                      status
    DELETE /entities/{type}/{id}                    delete (202; the worker deletes it)
    POST /entities/{type}/{id}/resume               un-park a failed entity {skip_failed}
    GET  /entities/{type}/{id}/state                committed collections
    GET  /entities/{type}/{id}/children             spawned children and their last run
    GET  /entities/{type}/{id}/events               server-sent events (?live=1, ?follow=0,
                                                    ?tail=N); resumable with Last-Event-ID
    POST /entities/{type}/{id}/cancel               cancel the current run
    GET  /entities/{type}/{id}/actions              pending actions
    POST /entities/{type}/{id}/actions/{call}/{verb}  submit | fail | cancel | skip | approve | deny
                                                    | data (set the tool data of a pending call)
    GET  /entities/{type}/{id}/schedules            recurring schedules
    POST /entities/{type}/{id}/schedules            upsert {id, expression, timezone, payload}
    DELETE /entities/{type}/{id}/schedules/{schedule}  delete one
    GET  /healthz, /readyz, /metrics                alive; ready (Redis, every partition
                                                    leased); Prometheus text (health.py)

An unknown route is a JSON 404, a wrong method a JSON 405 (with ``Allow``).

Authentication turns a request into a trusted ``identity`` (``bearer_tokens``
is an example); ``client_data`` from the body is passed on untrusted. An
authoriser (``authorization.py``) decides who may read or write which entity: by
default, with authentication, an entity belongs to the identity that created it.

Status codes: 400 malformed request (input is parsed strictly: http_input.py),
401 not authenticated, 403 not allowed, 404 unknown type or entity, 409
conflict (other args, action not pending), 413 body or payload too large, 415 a
body that is not sent as application/json, 421 a ``Host`` not allowed, 422 a
value fails its schema, 503 Redis unreachable (``RedisUnavailable``) or too many
open event streams (both with ``Retry-After``), 507 Redis is full (at its
``maxmemory``). A request that fails writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import console_api, health
from .authorization import (
    Access,
    Authorizer,
    EntityAccess,
    allow_all,
    check,
    owner_only,
    readable,
)
from .client import Runtime
from .errors import EntityNotFoundError, HTTPError, OwnerChangedError
from .gateway_responses import JSONResponse, failure_response, http_exception
from .gateway_streams import CountedStream, StreamSlots, caller_key, sse_events
from .http_input import (
    message_fields,
    query_flag,
    query_int,
    query_url,
    read_body,
    resume_position,
    text_field,
)
from .http_limits import HostAllowList
from .openapi import LIST_LIMIT, OPENAPI, TAIL_LIMIT
from .schedules import CronSchedule
from .urls import entity_url

CONSOLE_DIR = Path(__file__).parent / "console"

Identity = dict[str, str]
Authenticate = Callable[[Request], Awaitable[Identity | None]]


def bearer_tokens(tokens: dict[str, Identity]) -> Authenticate:
    """An example authenticator: ``Authorization: Bearer <token>`` -> identity."""

    async def authenticate(request: Request) -> Identity | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return tokens.get(token) if scheme.lower() == "bearer" else None

    return authenticate


CONVERSATION_WAIT_S = 30.0  # how long POST .../compact or .../reset with wait may take


def create_app(
    runtime: Runtime,
    *,
    authenticate: Authenticate | None = None,
    authorize: Authorizer | None = None,
    max_body_bytes: int | None = None,
    max_streams: int | None = None,
    max_streams_per_identity: int | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """An ASGI app serving ``runtime``. Without ``authenticate`` every caller is anonymous.

    ``authorize`` decides who may read and write which entity (``authorization.py``);
    the default is :func:`~wakeful.authorization.owner_only` with ``authenticate``
    (an entity belongs to the identity that created it) and
    :func:`~wakeful.authorization.allow_all` without.
    A request body over ``max_body_bytes`` (default: the setting
    ``max_body_bytes``) is refused with 413 before it is read past the limit.
    With ``allowed_hosts`` a request whose ``Host`` is not one of them is refused
    with 421 (against DNS rebinding; see http_limits.HostAllowList); without, any
    ``Host`` is served.

    Open event streams are capped at ``max_streams`` in total and
    ``max_streams_per_identity`` per identity (an anonymous caller: per client
    address); the defaults are the runtime's settings ``max_event_streams`` and
    ``max_event_streams_per_identity``. A stream over a cap is refused with 503
    and ``Retry-After``.
    """
    settings = runtime.settings
    policy = authorize or (owner_only if authenticate is not None else allow_all)
    body_limit = max_body_bytes if max_body_bytes is not None else settings.max_body_bytes
    slots = StreamSlots(
        max_streams if max_streams is not None else settings.max_event_streams,
        max_streams_per_identity
        if max_streams_per_identity is not None
        else settings.max_event_streams_per_identity,
    )

    async def caller(request: Request) -> Identity | None:
        if authenticate is None:
            return None
        identity = await authenticate(request)
        if identity is None:
            raise HTTPError(401, "NotAuthenticated", "missing or invalid credentials")
        return identity

    async def body(request: Request) -> dict[str, Any]:
        return await read_body(request, body_limit)

    async def entity(request: Request, access: Access) -> tuple[str, Identity | None]:
        url, identity, _ = await entity_access(request, access)
        return url, identity

    async def entity_access(
        request: Request, access: Access
    ) -> tuple[str, Identity | None, EntityAccess]:
        identity = await caller(request)
        url = entity_url(request.path_params["type"], request.path_params["id"])
        allowed = await check(policy, runtime, identity, url, access)
        if allowed is None:
            raise HTTPError(403, "Forbidden", f"not allowed to {access} {url}")
        if access == "read" and not allowed.exists:
            raise EntityNotFoundError(url)  # created meanwhile, it would not be checked
        return url, identity, allowed

    async def owned_write(
        request: Request,
        decided: tuple[str, Identity | None, EntityAccess],
        write: Callable[[Identity | None, str], Awaitable[Any]],
    ) -> Any:
        """A write that carries the owner the authoriser saw: if it changed before the
        write (nothing is written then), decide again (a few times)."""
        url, identity, allowed = decided
        for _ in range(3):
            try:
                return await write(identity, allowed.mark)
            except OwnerChangedError:
                url, identity, allowed = await entity_access(request, "write")
        raise OwnerChangedError(url, allowed.mark)

    def endpoint(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # a refusal, Redis unreachable, or a bug
                return failure_response(request, exc)

        return wrapped

    @endpoint
    async def manifest(request: Request) -> Response:
        await caller(request)
        return JSONResponse(runtime.registry.manifest())

    @endpoint
    async def workers(request: Request) -> Response:
        await caller(request)
        live = await runtime.workers()
        owners = await runtime.partition_owners()
        return JSONResponse(
            {
                "workers": [dataclasses.asdict(w) for w in live],
                "unserved": [p for p, owner in owners.items() if owner is None],
                "partitions": len(owners),
            }
        )

    @endpoint
    async def openapi(request: Request) -> Response:
        return JSONResponse(OPENAPI)

    @endpoint
    async def create(request: Request) -> Response:
        decided = await entity_access(request, "write")
        data = await body(request)
        await owned_write(
            request,
            decided,
            lambda identity, mark: runtime.create(
                request.path_params["type"],
                request.path_params["id"],
                data.get("args"),
                initial_message=data.get("message"),
                idempotency_key=request.headers.get("idempotency-key"),
                identity=identity,
                client_data=data.get("client_data"),
                expect_owner=mark,
            ),
        )
        return JSONResponse({"url": decided[0]}, status_code=201)

    @endpoint
    async def send(request: Request) -> Response:
        decided = await entity_access(request, "write")
        url = decided[0]
        message = message_fields(await body(request))
        event_id = await owned_write(
            request,
            decided,
            lambda identity, mark: runtime.send(
                url,
                idempotency_key=request.headers.get("idempotency-key"),
                identity=identity,
                expect_owner=mark,
                **message,
            ),
        )
        return JSONResponse({"url": url, "event_id": event_id}, status_code=202)

    @endpoint
    async def status(request: Request) -> Response:
        url, _ = await entity(request, "read")
        return JSONResponse(dataclasses.asdict(await runtime.status(url, runs=True)))

    @endpoint
    async def state(request: Request) -> Response:
        url, _ = await entity(request, "read")
        await runtime.status(url)  # 404 for a missing entity
        return JSONResponse(await runtime.state(url))

    async def entity_root(request: Request) -> Response:
        return await {"POST": create, "DELETE": delete}.get(request.method, status)(request)

    @endpoint
    async def delete(request: Request) -> Response:
        url, _ = await entity(request, "write")
        await runtime.status(url)  # 404 for a missing entity
        await runtime.delete(url, wait=False)
        return JSONResponse({"url": url, "deleting": True}, status_code=202)

    @endpoint
    async def resume(request: Request) -> Response:
        url, _ = await entity(request, "write")
        skip_failed = (await body(request)).get("skip_failed", False)
        if not isinstance(skip_failed, bool):
            raise HTTPError(400, "BadField", "skip_failed must be true or false")
        skipped = await runtime.resume(url, skip_failed=skip_failed)
        return JSONResponse({"url": url, "resumed": True, "skipped": skipped})

    @endpoint
    async def listing(request: Request) -> Response:
        identity = await caller(request)
        after = query_url(request, "after")
        limit = query_int(request, "limit", LIST_LIMIT, 1, LIST_LIMIT)
        urls = [url for url in await runtime.list(request.path_params["type"]) if url > after]
        return JSONResponse(await readable(policy, runtime, identity, urls, limit))

    @endpoint
    async def children(request: Request) -> Response:
        url, _ = await entity(request, "read")
        await runtime.status(url)
        return JSONResponse([msgspec.to_builtins(c) for c in await runtime.children(url)])

    async def console_root(request: Request) -> Response:
        return RedirectResponse("/console/")

    @endpoint
    async def cancel(request: Request) -> Response:
        url, _ = await entity(request, "write")
        reason = text_field(await body(request), "reason", url)
        event_id = await runtime.cancel(url, reason or "cancelled over HTTP")
        return JSONResponse({"url": url, "event_id": event_id}, status_code=202)

    def conversation_request(
        action: Literal["compact", "reset"],
    ) -> Callable[[Request], Awaitable[Response]]:
        """``POST .../compact`` and ``.../reset``: ask the entity's agent to compact or
        reset its conversation (``rt.compact`` / ``rt.reset_conversation``). With
        ``{"wait": true}`` the answer says whether it did, once the entity is idle."""

        @endpoint
        async def request_it(request: Request) -> Response:
            url, _ = await entity(request, "write")
            wait = (await body(request)).get("wait", False)
            if not isinstance(wait, bool):
                raise HTTPError(400, "BadField", "wait must be true or false")
            ask = runtime.compact if action == "compact" else runtime.reset_conversation
            done = await ask(url, wait=wait, timeout=CONVERSATION_WAIT_S)
            if not wait:
                return JSONResponse({"url": url, "requested": action}, status_code=202)
            return JSONResponse({"url": url, "compacted" if action == "compact" else "reset": done})

        return request_it

    @endpoint
    async def actions(request: Request) -> Response:
        url, _ = await entity(request, "read")
        await runtime.status(url)
        pending = await runtime.pending_actions(url)
        return JSONResponse([msgspec.to_builtins(a) for a in pending])

    @endpoint
    async def answer(request: Request) -> Response:
        url, identity = await entity(request, "write")
        data = await body(request)
        call = request.path_params["call"]
        verb = request.path_params["verb"]
        if verb == "submit":
            if "output" not in data:
                raise HTTPError(400, "MissingField", "the body needs an 'output'")
            event_id = await runtime.submit_tool_result(
                url, call, data["output"], identity=identity
            )
        elif verb == "fail":
            error = text_field(data, "error", url)
            event_id = await runtime.fail_action(
                url, call, "failed" if error is None else error, identity=identity
            )
        elif verb == "cancel":
            event_id = await runtime.cancel_action(url, call, identity=identity)
        elif verb == "data":
            if "data" not in data:
                raise HTTPError(400, "MissingField", "the body needs a 'data'")
            event_id = await runtime.set_tool_data(url, call, data["data"], identity=identity)
        elif verb == "skip":
            event_id = await runtime.skip_action(
                url, call, text_field(data, "reason", url), identity=identity
            )
        elif verb == "approve":
            event_id = await runtime.approve(
                url, call, edited_input=data.get("edited_input"), identity=identity
            )
        elif verb == "deny":
            reason = text_field(data, "reason", url)
            event_id = await runtime.deny(
                url, call, "denied" if reason is None else reason, identity=identity
            )
        else:
            raise HTTPError(404, "UnknownVerb", f"unknown action verb {verb!r}")
        return JSONResponse({"url": url, "event_id": event_id})

    def listed_schedule(schedule: CronSchedule) -> dict[str, Any]:
        return {**dataclasses.asdict(schedule), "next": schedule.next_at.isoformat()}

    @endpoint
    async def schedules(request: Request) -> Response:
        if request.method == "POST":
            url, _ = await entity(request, "write")
            data = await body(request)
            for field in ("id", "expression"):
                if field not in data:
                    raise HTTPError(400, "MissingField", f"the body needs an {field!r}")
            schedule = await runtime.upsert_cron_schedule(
                url,
                data["id"],
                data["expression"],
                timezone=data.get("timezone", "UTC"),
                payload=data.get("payload"),
            )
            return JSONResponse(listed_schedule(schedule))
        url, _ = await entity(request, "read")
        return JSONResponse([listed_schedule(s) for s in await runtime.cron_schedules(url)])

    @endpoint
    async def delete_schedule(request: Request) -> Response:
        url, _ = await entity(request, "write")
        schedule_id = request.path_params["schedule"]
        if not await runtime.delete_cron_schedule(url, schedule_id):
            raise HTTPError(404, "ScheduleNotFound", f"{url} has no schedule {schedule_id!r}")
        return JSONResponse({"url": url, "deleted": schedule_id})

    @endpoint
    async def events(request: Request) -> Response:
        url, identity = await entity(request, "read")
        await runtime.status(url)
        live = query_flag(request, "live", False)
        follow = query_flag(request, "follow", True)
        after, live_after = resume_position(request)
        tail = query_int(request, "tail", 0, 1, TAIL_LIMIT)
        if tail and after is None:  # a first look: only the latest entries
            after = await runtime.log_position(url, back=tail)
        stream = sse_events(runtime, url, after, live_after, live=live, follow=follow)
        if not (follow or live):  # reads to the end of the log and returns: not held open
            return StreamingResponse(stream, media_type="text/event-stream")
        key = caller_key(identity, request)
        slots.take(key)
        return CountedStream(stream, lambda: slots.give_back(key))

    base = "/entities/{type}/{id}"
    console = console_api.GatewayParts(runtime, policy, caller, entity, endpoint, JSONResponse)
    guards = [] if allowed_hosts is None else [Middleware(HostAllowList, hosts=allowed_hosts)]
    return Starlette(
        middleware=guards,
        exception_handlers={StarletteHTTPException: http_exception},
        routes=[
            *health.routes(runtime),
            Route("/", console_root),
            Mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console"),
            Route("/manifest", manifest),
            Route("/openapi.json", openapi),
            Route("/workers", workers),
            *console_api.routes(console),  # the console's operator reads
            Route("/entities/{type}", listing, methods=["GET"]),
            Route(base, entity_root, methods=["GET", "POST", "DELETE"]),
            Route(base + "/resume", resume, methods=["POST"]),
            Route(base + "/messages", send, methods=["POST"]),
            Route(base + "/state", state),
            Route(base + "/children", children),
            Route(base + "/events", events),
            Route(base + "/cancel", cancel, methods=["POST"]),
            Route(base + "/compact", conversation_request("compact"), methods=["POST"]),
            Route(base + "/reset", conversation_request("reset"), methods=["POST"]),
            Route(base + "/actions", actions),
            Route(base + "/actions/{call}/{verb}", answer, methods=["POST"]),
            Route(base + "/schedules", schedules, methods=["GET", "POST"]),
            Route(base + "/schedules/{schedule}", delete_schedule, methods=["DELETE"]),
        ],
    )
