"""The gateway's OpenAPI document (served at ``GET /openapi.json``).

Kept apart from the routes in ``gateway.py``: it is data, built once at import,
and the API fuzz test (tests/test_gateway_fuzz.py) runs the routes from it.
"""

from __future__ import annotations

from typing import Any

from .schedules import ID_MAX as SCHEDULE_ID_MAX
from .schedules import ID_PATTERN as SCHEDULE_ID_PATTERN
from .urls import ID_MAX, ID_PATTERN, TYPE_MAX, TYPE_PATTERN

LIST_LIMIT = 1000  # urls per page of GET /entities/{type}; ?after=<last url> for the next
TAIL_LIMIT = 100_000  # most entries ?tail= may ask for

_ENTITY_PARAMS = [
    {
        "name": "type",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{TYPE_PATTERN}$", "maxLength": TYPE_MAX},
    },
    {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{ID_PATTERN}$", "maxLength": ID_MAX},
    },
]
_ERROR = {
    "description": "error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _op(
    summary: str, *codes: int, body: dict[str, Any] | None = None, params: list[Any] | None = None
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": _ENTITY_PARAMS + (params or []),
        "responses": {"200": {"description": "ok"}, **{str(c): _ERROR for c in codes}},
    }
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return op


_TEXT = {"type": "string"}
_CONVERSATION_BODY = {"type": "object", "properties": {"wait": {"type": "boolean"}}}
_CONVERSATION_REQUESTS = [
    (
        "compact",
        "Ask the entity's agent to summarise the older turns of its conversation",
        '{"compacted": bool}',
    ),
    (
        "reset",
        "Ask the entity's agent to drop every turn before its open run (the log keeps them)",
        '{"reset": bool}',
    ),
]
_STATUS_JSON = {"description": "status", "content": {"application/json": {"schema": {}}}}
_ANSWERS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "submit",
        "Answer a client tool call with its output (checked against its output schema)",
        {"type": "object", "required": ["output"], "properties": {"output": {}}},
    ),
    ("fail", "Fail a client tool call", {"type": "object", "properties": {"error": _TEXT}}),
    ("cancel", "Cancel a pending call (client tool or approval)", {"type": "object"}),
    (
        "approve",
        "Approve a call, optionally with an edited input",
        {"type": "object", "properties": {"edited_input": {}}},
    ),
    ("deny", "Deny a call", {"type": "object", "properties": {"reason": _TEXT}}),
    (
        "data",
        "Set the tool data of a pending call (public state renderers read; it does not "
        "answer the call)",
        {"type": "object", "required": ["data"], "properties": {"data": {}}},
    ),
    (
        "skip",
        "Skip a pending call (client tool or approval): the model gets a synthetic output",
        {"type": "object", "properties": {"reason": _TEXT}},
    ),
]


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    param = {"name": name, "in": "query", "schema": schema}
    return {**param, "description": description} if description else param


CONSOLE_PAGE = 200  # entities per page of GET /entities
JOURNAL_PAGE = 1000  # entries per page of GET .../journal
TREE_DEPTH = 8  # levels GET .../tree goes down at most
# The console's operator reads (console_api.py).
_CONSOLE_PATHS: dict[str, Any] = {
    "/entities": {
        "get": {
            "summary": "Every entity the caller may read, across types, with its status and lag",
            "parameters": [
                _query("status", _TEXT, "statuses, comma-separated (failed,waiting,...)"),
                _query("type", {"type": "string", "maxLength": TYPE_MAX}),
                _query("q", {"type": "string", "maxLength": 270}, "a part of the url"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": CONSOLE_PAGE}),
                _query(
                    "after", {"type": "string", "maxLength": 270}, "the next page: the last 'next'"
                ),
            ],
            "responses": {
                "200": {"description": "ok"},
                **{str(c): _ERROR for c in (400, 401, 404)},
            },
        }
    },
    "/entities/{type}/{id}/overview": {
        "get": _op("Status, lag, partition and the worker serving it", 400, 401, 403, 404)
    },
    "/entities/{type}/{id}/journal": {
        "get": _op(
            "The log, every event decoded (errors redacted, no tracebacks), a page at a time",
            400,
            401,
            403,
            404,
            params=[
                _query("after", _TEXT, "an entry id: the page after it"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": JOURNAL_PAGE}),
            ],
        )
    },
    "/entities/{type}/{id}/tree": {
        "get": _op(
            "Children, their children, ... with each one's status",
            400,
            401,
            403,
            404,
            params=[_query("depth", {"type": "integer", "minimum": 1, "maximum": TREE_DEPTH})],
        )
    },
}
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Wakeful gateway", "version": "1"},
    "components": {
        "schemas": {
            "Error": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                    }
                },
            }
        },
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    },
    "paths": {
        "/manifest": {
            "get": {
                "summary": "The registry's contract",
                "responses": {"200": {"description": "ok"}},
            }
        },
        "/workers": {
            "get": {
                "summary": "Live workers, the partitions each holds, partitions without one",
                "responses": {"200": {"description": "ok"}, "401": _ERROR},
            }
        },
        "/healthz": {
            "get": {
                "summary": "The process is alive (and its worker, if any, has not stopped)",
                "responses": {"200": _STATUS_JSON, "503": _STATUS_JSON},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Redis answers and every partition is leased by a live worker",
                "responses": {"200": _STATUS_JSON, "503": _STATUS_JSON},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Metrics in the Prometheus text format",
                "responses": {
                    "200": {
                        "description": "ok",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/entities/{type}/{id}": {
            "get": _op("Entity status", 400, 401, 403, 404),
            "delete": {
                **_op("Delete an entity (its worker deletes it)", 400, 401, 403, 404),
                "responses": {
                    "202": {"description": "accepted"},
                    **{str(c): _ERROR for c in (400, 401, 403, 404)},
                },
            },
            "post": _op(
                "Create an entity (get-or-create)",
                400,
                401,
                403,
                404,
                409,
                413,
                422,
                507,
                body={"type": "object", "properties": {"args": {}, "message": {}}},
            ),
        },
        "/entities/{type}/{id}/messages": {
            "post": _op(
                "Send a message",
                400,
                401,
                403,
                404,
                409,  # the entity's owner kept changing while the request was checked
                413,
                422,
                507,  # Redis is full (at its maxmemory): nothing was written
                body={
                    "type": "object",
                    "description": "a 'payload', 'content' blocks, or both",
                    "properties": {
                        "payload": {},
                        "client_data": {},
                        "client_tools": {"type": "array"},
                        "content": {
                            "type": "array",
                            "description": "content blocks after the payload's text: "
                            "text, image (base64 or url), document (PDF, text or url)",
                            "items": {"type": "object"},
                        },
                    },
                },
                params=[{"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}}],
            )
        },
        "/entities/{type}": {
            "get": {
                "summary": "Urls of the type's entities the caller may read, sorted",
                "parameters": [
                    _ENTITY_PARAMS[0],
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT},
                    },
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "ok"},
                    **{str(c): _ERROR for c in (400, 401, 404)},
                },
            }
        },
        "/entities/{type}/{id}/state": {"get": _op("Committed collections", 400, 401, 403, 404)},
        "/entities/{type}/{id}/children": {
            "get": _op("Spawned children and their last run", 400, 401, 403, 404)
        },
        "/entities/{type}/{id}/events": {
            "get": _op(
                "Server-sent events: the log (and live output with live=1); resume with Last-Event-ID",
                400,
                401,
                403,
                404,
                503,  # too many open streams (in total or of the caller): Retry-After
                params=[
                    {"name": "live", "in": "query", "schema": {"type": "boolean"}},
                    {"name": "follow", "in": "query", "schema": {"type": "boolean"}},
                    {
                        "name": "tail",
                        "in": "query",
                        "description": "without Last-Event-ID: start with the last N entries",
                        "schema": {"type": "integer", "minimum": 1, "maximum": TAIL_LIMIT},
                    },
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                ],
            )
        },
        "/entities/{type}/{id}/cancel": {
            "post": _op(
                "Cancel the current run",
                400,
                401,
                403,
                404,
                body={"type": "object", "properties": {"reason": {"type": "string"}}},
            )
        },
        **{
            f"/entities/{{type}}/{{id}}/{action}": {
                "post": {
                    **_op(summary, body=_CONVERSATION_BODY),
                    "responses": {
                        "200": {"description": "done (with wait): " + done},
                        "202": {"description": "requested (without wait)"},
                        **{str(c): _ERROR for c in (400, 401, 403, 404, 504)},
                    },
                }
            }
            for action, summary, done in _CONVERSATION_REQUESTS
        },
        "/entities/{type}/{id}/resume": {
            "post": _op(
                "Un-park a failed entity; skip_failed dead-letters the inputs of the failure",
                400,
                401,
                403,
                404,
                409,
                body={"type": "object", "properties": {"skip_failed": {"type": "boolean"}}},
            )
        },
        "/entities/{type}/{id}/actions": {"get": _op("Pending actions", 400, 401, 403, 404)},
        "/entities/{type}/{id}/schedules": {
            "get": _op(
                "Recurring schedules, the soonest next occurrence first", 400, 401, 403, 404
            ),
            "post": _op(
                "Create or replace a recurring schedule (a 5-field cron expression in an IANA "
                "time zone; each occurrence sends the entity a message with the payload)",
                400,
                401,
                403,
                404,
                413,
                422,
                body={
                    "type": "object",
                    "required": ["id", "expression"],
                    "properties": {
                        "id": {
                            "type": "string",
                            "pattern": f"^{SCHEDULE_ID_PATTERN}$",
                            "maxLength": SCHEDULE_ID_MAX,
                        },
                        "expression": {"type": "string"},
                        "timezone": {"type": "string"},
                        "payload": {},
                    },
                },
            ),
        },
        "/entities/{type}/{id}/schedules/{schedule}": {
            "delete": _op(
                "Delete a recurring schedule",
                400,
                401,
                403,
                404,
                422,
                params=[
                    {
                        "name": "schedule",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
            )
        },
        **{
            f"/entities/{{type}}/{{id}}/actions/{{call}}/{verb}": {
                "post": _op(
                    summary,
                    400,
                    401,
                    403,
                    404,
                    409,
                    422,
                    body=body,
                    params=[
                        {
                            "name": "call",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                )
            }
            for verb, summary, body in _ANSWERS
        },
        **_CONSOLE_PATHS,
    },
}
for _operations in OPENAPI["paths"].values():
    if "post" in _operations:  # every POST takes a JSON body (see http_input.read_body)
        _operations["post"]["responses"]["413"] = _ERROR
        _operations["post"]["responses"]["415"] = _ERROR
    for _operation in _operations.values():  # a Host not allowed (http_limits.HostAllowList)
        _operation["responses"]["421"] = _ERROR
