"""The gateway's responses: JSON always valid, and every error as a JSON error.

An error is ``{"error": {"type", "message"}}`` with the status code its class maps
to (the table below, most specific first; see the gateway's docstring), and
Starlette's own 404 and 405 are sent the same way. :func:`failure_response` is the
one place a failed request becomes its answer: a refusal, Redis unreachable (503
``RedisUnavailable`` with ``Retry-After``, a warning in the log), or a bug (500,
its traceback in the log and none in the answer).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette import responses
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from .actions import (
    ActionError,
    ActionNotAuthorizedError,
    ActionNotPendingError,
    ActionValidationError,
    ClientToolsError,
)
from .connection import AUTHENTICATION_ERRORS, CLUSTER_ERRORS, UNREACHABLE_ERRORS
from .errors import (
    ArgsConflictError,
    EntityNotFoundError,
    EventDecodeError,
    HTTPError,
    InvalidArgsError,
    InvalidEventError,
    InvalidIdempotencyKeyError,
    InvalidPayloadError,
    InvalidScheduleError,
    InvalidUrlError,
    NotFailedError,
    OwnerChangedError,
    PayloadTooLargeError,
    RedisFullError,
    ReplicaWaitError,
    SnapshotError,
    UnknownEntityTypeError,
    WaitTimeoutError,
    WakefulError,
)

log = logging.getLogger("wakeful.gateway")
RETRY_AFTER_S = 5  # what a 503 (Redis unreachable, too many event streams) says to wait

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
    (OwnerChangedError, 409),  # the owner kept changing while the request was checked
    (NotFailedError, 409),
    (InvalidArgsError, 422),
    (InvalidIdempotencyKeyError, 400),  # the Idempotency-Key header
    (InvalidScheduleError, 422),
    (RedisFullError, 507),  # Redis at maxmemory: nothing was written, retry later
    # Written, but too few replicas confirmed it in time: retry with the same key (503,
    # like any other state of the servers the request cannot help, with Retry-After).
    (ReplicaWaitError, 503),
    (WaitTimeoutError, 504),  # a wait (compact or reset with wait) ran out
    # The entity's stored state is damaged (a snapshot or log entry no one can decode):
    # the server's data, not the request, so 500, naming the entry (and logged).
    (EventDecodeError, 500),
    (SnapshotError, 500),
    (WakefulError, 400),
]


class JSONResponse(responses.JSONResponse):
    """Always valid JSON. A client's NaN or Infinity is refused on the way in (see
    http_input.py), but what a handler or a model wrote is kept as it is: a float
    JSON cannot carry is written as ``null``, never as a bare ``NaN`` (or a 500)."""

    def render(self, content: Any) -> bytes:
        return json_text(content).encode()


def json_text(value: Any) -> str:
    return msgspec.json.encode(value, enc_hook=str).decode()


def failure_response(request: Request, exc: Exception) -> JSONResponse:
    """The answer to a request that raised ``exc``."""
    if isinstance(exc, AUTHENTICATION_ERRORS):  # the gateway's settings, not the request
        log.error(
            "gateway: %s %s: Redis refused the gateway's credentials: %s",
            request.method,
            request.url.path,
            exc,
        )
        response = _error(503, "RedisUnavailable", "Redis refused the gateway's credentials")
    elif isinstance(exc, (*UNREACHABLE_ERRORS, *CLUSTER_ERRORS)):
        # Not the gateway's fault, nor the request's: one line, no traceback.
        log.warning(
            "gateway: %s %s: Redis is unreachable (%s: %s)",
            request.method,
            request.url.path,
            type(exc).__name__,
            exc,
        )
        message = "Redis is unreachable; try again"
        response = _error(503, "RedisUnavailable", message)
    elif isinstance(exc, (HTTPError, WakefulError)):
        response = error_response(exc)
        if response.status_code == 500:  # damaged data: the operator's to repair
            log.warning("gateway: %s %s: %s", request.method, request.url.path, exc)
    else:  # a bug: log it, and answer JSON without internals
        log.error("gateway: %s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "InternalError", "the gateway failed")
    if response.status_code == 401:  # how to authenticate (RFC 9110): a bearer token
        response.headers["WWW-Authenticate"] = "Bearer"
    if response.status_code == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    if response.status_code == 413:  # the rest of the body is not read
        response.headers["Connection"] = "close"
    return response


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def error_response(exc: Exception) -> JSONResponse:
    if isinstance(exc, HTTPError):
        status, kind = exc.status, exc.kind
    else:
        status = next(code for cls, code in _STATUS if isinstance(exc, cls))
        kind = type(exc).__name__
    return _error(status, kind, str(exc))


async def http_exception(request: Request, exc: Exception) -> Response:
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
