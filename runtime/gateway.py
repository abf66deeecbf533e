"""The HTTP gateway: entity URLs over HTTP (``wakeful serve APP``).

Routes (all JSON; errors are ``{"error": {"type", "message"}}`` with the
status code below):

    GET  /                                          the web console (static, /console/)
    GET  /manifest                                  the registry's contract
    GET  /openapi.json                              this API
    GET  /workers                                   live workers, their partitions, and the
                                                    partitions no live worker serves
    GET  /entities/{type}                           urls of the type's entities the caller may
                                                    read, sorted (?limit=, ?after=<last url>)
    POST /entities/{type}/{id}                      create (get-or-create) {args, message}
    POST /entities/{type}/{id}/messages             send {payload, client_data, client_tools};
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
    POST /entities/{type}/{id}/actions/{call}/{verb}  submit | fail | cancel | approve | deny
    GET  /healthz, /readyz, /metrics                alive; ready (Redis, every partition
                                                    leased); Prometheus text (health.py)

An unknown route is a JSON 404, a wrong method a JSON 405 (with ``Allow``).

Authentication turns a request into a trusted ``identity`` (``bearer_tokens``
is an example); ``client_data`` from the body is passed on untrusted. An
authoriser decides who may read or write which entity.

Status codes: 400 malformed request, 401 not authenticated, 403 not allowed,
404 unknown type or entity, 409 conflict (other args, action not pending),
413 body or payload too large, 415 a body that is not sent as
application/json, 422 a value fails its schema, 503 too many open event streams
(with ``Retry-After``). A request that fails writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import health
from .actions import (
    ActionError,
    ActionNotAuthorizedError,
    ActionNotPendingError,
    ActionValidationError,
    ClientToolsError,
)
from .client import Runtime
from .errors import (
    ArgsConflictError,
    EntityNotFoundError,
    InvalidArgsError,
    InvalidEventError,
    InvalidPayloadError,
    InvalidUrlError,
    NotFailedError,
    PayloadTooLargeError,
    UnknownEntityTypeError,
    WakefulError,
)
from .events import LogRecord, UndecodableRecord
from .live import LiveRecord
from .openapi import LIST_LIMIT, OPENAPI, TAIL_LIMIT
from .urls import entity_url

CONSOLE_DIR = Path(__file__).parent / "console"
log = logging.getLogger("wakeful.gateway")

Identity = dict[str, str]
Authenticate = Callable[[Request], Awaitable[Identity | None]]
Authorize = Callable[[Identity | None, str, str], bool]  # (identity, url, "read" | "write")


class HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


_STATUS: list[tuple[type[Exception], int]] = [
    (ActionNotAuthorizedError, 403),
    (ActionNotPendingError, 409),
    (ActionValidationError, 422),
    (ActionError, 409),
    (ClientToolsError, 422),
    (InvalidUrlError, 400),
    (UnknownEntityTypeError, 404),
    (EntityNotFoundError, 404),
    (PayloadTooLargeError, 413),
    (InvalidEventError, 400),  # a field of the wrong type (nothing was written)
    (InvalidPayloadError, 422),
    (ArgsConflictError, 409),
    (NotFailedError, 409),
    (InvalidArgsError, 422),
    (WakefulError, 400),
]


def bearer_tokens(tokens: dict[str, Identity]) -> Authenticate:
    """An example authenticator: ``Authorization: Bearer <token>`` -> identity."""

    async def authenticate(request: Request) -> Identity | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return tokens.get(token) if scheme.lower() == "bearer" else None

    return authenticate


def allow_all(identity: Identity | None, url: str, access: str) -> bool:
    return True


def error_response(exc: Exception) -> JSONResponse:
    if isinstance(exc, HTTPError):
        status, kind = exc.status, exc.kind
    else:
        status = next(code for cls, code in _STATUS if isinstance(exc, cls))
        kind = type(exc).__name__
    return JSONResponse({"error": {"type": kind, "message": str(exc)}}, status_code=status)


RETRY_AFTER_S = 5  # what a refused event stream is told to wait


class StreamSlots:
    """Open event streams, counted in total and per caller: each holds a Redis
    connection while it waits, so they are capped below the client's pool."""

    def __init__(self, total: int, per_caller: int) -> None:
        self.total = total
        self.per_caller = per_caller
        self.open: dict[str, int] = {}

    def take(self, caller: str) -> None:
        """Count a new stream of ``caller``, or refuse it with a 503."""
        if sum(self.open.values()) >= self.total:
            raise HTTPError(
                503, "TooManyStreams", f"the gateway serves {self.total} event streams already"
            )
        if self.open.get(caller, 0) >= self.per_caller:
            raise HTTPError(
                503, "TooManyStreams", f"this caller has {self.per_caller} event streams open"
            )
        self.open[caller] = self.open.get(caller, 0) + 1

    def give_back(self, caller: str) -> None:
        left = self.open.get(caller, 0) - 1
        if left > 0:
            self.open[caller] = left
        else:
            self.open.pop(caller, None)


class _CountedStream(StreamingResponse):
    """An event stream that gives its slot back when the response ends, however it ends."""

    def __init__(self, stream: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(stream, media_type="text/event-stream")
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def create_app(
    runtime: Runtime,
    *,
    authenticate: Authenticate | None = None,
    authorize: Authorize = allow_all,
    max_body_bytes: int = 1024 * 1024,
    max_streams: int | None = None,
    max_streams_per_identity: int | None = None,
) -> Starlette:
    """An ASGI app serving ``runtime``. Without ``authenticate`` every caller is anonymous.

    Open event streams are capped at ``max_streams`` in total and
    ``max_streams_per_identity`` per identity (an anonymous caller: per client
    address); the defaults are the runtime's settings ``max_event_streams`` and
    ``max_event_streams_per_identity``. A stream over a cap is refused with 503
    and ``Retry-After``.
    """
    settings = runtime.settings
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
        # Only JSON: a browser sends a cross-site form or text/plain POST without asking,
        # but must ask (CORS preflight, which this app never grants) before sending JSON.
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise HTTPError(
                415,
                "UnsupportedMediaType",
                f"send the body as JSON with Content-Type: application/json "
                f"(got {media_type or 'no content type'})",
            )
        raw = await request.body()
        if len(raw) > max_body_bytes:
            raise HTTPError(
                413, "BodyTooLarge", f"request body is {len(raw)} bytes, over {max_body_bytes}"
            )
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except UnicodeDecodeError as exc:
            raise HTTPError(400, "MalformedJSON", f"request body is not UTF-8: {exc}") from None
        except json.JSONDecodeError as exc:
            raise HTTPError(400, "MalformedJSON", f"request body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "MalformedJSON", "request body must be a JSON object")
        return data

    async def entity(request: Request, access: str) -> tuple[str, Identity | None]:
        identity = await caller(request)
        url = entity_url(request.path_params["type"], request.path_params["id"])
        if not authorize(identity, url, access):
            raise HTTPError(403, "Forbidden", f"not allowed to {access} {url}")
        return url, identity

    def endpoint(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except (HTTPError, WakefulError) as exc:
                response = error_response(exc)
                if response.status_code == 503:
                    response.headers["Retry-After"] = str(RETRY_AFTER_S)
                return response
            except Exception:  # a bug: log it, and answer JSON without internals
                log.exception("gateway: %s %s failed", request.method, request.url.path)
                return JSONResponse(
                    {"error": {"type": "InternalError", "message": "the gateway failed"}},
                    status_code=500,
                )

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
        url, identity = await entity(request, "write")
        data = await body(request)
        await runtime.create(
            request.path_params["type"],
            request.path_params["id"],
            data.get("args"),
            initial_message=data.get("message"),
            idempotency_key=request.headers.get("idempotency-key"),
            identity=identity,
            client_data=data.get("client_data"),
        )
        return JSONResponse({"url": url}, status_code=201)

    @endpoint
    async def send(request: Request) -> Response:
        url, identity = await entity(request, "write")
        data = await body(request)
        if "payload" not in data:
            raise HTTPError(400, "MissingField", "the body needs a 'payload'")
        event_id = await runtime.send(
            url,
            data["payload"],
            idempotency_key=request.headers.get("idempotency-key"),
            identity=identity,
            client_data=data.get("client_data"),
            client_tools=data.get("client_tools"),
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
        after = request.query_params.get("after", "")
        try:
            limit = int(request.query_params.get("limit", LIST_LIMIT))
        except ValueError:
            raise HTTPError(400, "BadQuery", "limit must be a whole number") from None
        if not 1 <= limit <= LIST_LIMIT:
            raise HTTPError(400, "BadQuery", f"limit must be between 1 and {LIST_LIMIT}")
        readable = []
        for url in await runtime.list(request.path_params["type"]):
            if url > after and authorize(identity, url, "read"):
                readable.append(url)
                if len(readable) == limit:
                    break
        return JSONResponse(readable)

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
        data = await body(request)
        event_id = await runtime.cancel(url, data.get("reason") or "cancelled over HTTP")
        return JSONResponse({"url": url, "event_id": event_id}, status_code=202)

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
            event_id = await runtime.fail_action(
                url, call, str(data.get("error", "failed")), identity=identity
            )
        elif verb == "cancel":
            event_id = await runtime.cancel_action(url, call, identity=identity)
        elif verb == "approve":
            event_id = await runtime.approve(
                url, call, edited_input=data.get("edited_input"), identity=identity
            )
        elif verb == "deny":
            event_id = await runtime.deny(
                url, call, str(data.get("reason", "denied")), identity=identity
            )
        else:
            raise HTTPError(404, "UnknownVerb", f"unknown action verb {verb!r}")
        return JSONResponse({"url": url, "event_id": event_id})

    @endpoint
    async def events(request: Request) -> Response:
        url, identity = await entity(request, "read")
        await runtime.status(url)
        live = request.query_params.get("live") in ("1", "true")
        follow = request.query_params.get("follow", "1") not in ("0", "false")
        after, live_after = _resume(
            request.headers.get("last-event-id") or request.query_params.get("after")
        )
        tail = request.query_params.get("tail")
        if tail is not None and after is None:  # a first look: only the latest entries
            if not tail.isdigit() or not 1 <= int(tail) <= TAIL_LIMIT:
                raise HTTPError(400, "BadQuery", f"tail must be between 1 and {TAIL_LIMIT}")
            after = await runtime.log_position(url, back=int(tail))
        stream = _sse(runtime, url, after, live_after, live=live, follow=follow)
        if not (follow or live):  # reads to the end of the log and returns: not held open
            return StreamingResponse(stream, media_type="text/event-stream")
        key = _caller_key(identity, request)
        slots.take(key)
        return _CountedStream(stream, lambda: slots.give_back(key))

    base = "/entities/{type}/{id}"
    return Starlette(
        exception_handlers={StarletteHTTPException: _http_exception},
        routes=[
            *health.routes(runtime),
            Route("/", console_root),
            Mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console"),
            Route("/manifest", manifest),
            Route("/openapi.json", openapi),
            Route("/workers", workers),
            Route("/entities/{type}", listing, methods=["GET"]),
            Route(base, entity_root, methods=["GET", "POST", "DELETE"]),
            Route(base + "/resume", resume, methods=["POST"]),
            Route(base + "/messages", send, methods=["POST"]),
            Route(base + "/state", state),
            Route(base + "/children", children),
            Route(base + "/events", events),
            Route(base + "/cancel", cancel, methods=["POST"]),
            Route(base + "/actions", actions),
            Route(base + "/actions/{call}/{verb}", answer, methods=["POST"]),
        ],
    )


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route) and 405 (wrong method), as JSON errors."""
    assert isinstance(exc, StarletteHTTPException)
    kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    message = {
        404: f"no route {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return JSONResponse(
        {"error": {"type": kind, "message": message}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


def _caller_key(identity: Identity | None, request: Request) -> str:
    """Whose stream this is: the identity, or for an anonymous caller its address."""
    if identity is not None:
        return json.dumps(identity, sort_keys=True)
    return f"anonymous@{request.client.host if request.client else ''}"


def _resume(cursor: str | None) -> tuple[str | None, str | None]:
    """``Last-Event-ID`` is ``<log id>|<live id>``: the positions after the last event seen."""
    if not cursor:
        return None, None
    log_id, _, live_id = cursor.partition("|")
    return log_id or None, live_id or None


async def _sse(
    runtime: Runtime,
    url: str,
    after: str | None,
    live_after: str | None,
    *,
    live: bool,
    follow: bool,
) -> AsyncIterator[bytes]:
    log_pos, live_pos = after or "0-0", live_after or ""
    records = runtime.events(url, after=after, follow=follow, live=live, live_after=live_after)
    async for record in records:
        if isinstance(record, LiveRecord):
            live_pos = record.id
            kind, data = "live", msgspec.to_builtins(record.event)
        elif isinstance(record, LogRecord):
            log_pos = record.id
            kind = str(type(record.event).__struct_config__.tag)  # events' tags are str
            data = msgspec.to_builtins(record.event, enc_hook=_raw)
        else:
            assert isinstance(record, UndecodableRecord)
            log_pos = record.id
            kind, data = "undecodable", {"error": record.error}
        payload = json.dumps({"id": record.id, "event": data}, default=str)
        yield f"id: {log_pos}|{live_pos}\nevent: {kind}\ndata: {payload}\n\n".encode()


def _raw(value: Any) -> Any:
    if isinstance(value, msgspec.Raw):
        return msgspec.msgpack.decode(value)
    raise TypeError(f"cannot encode {type(value).__name__}")
