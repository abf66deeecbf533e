"""Pending tool actions: answering client-routed tool calls and approvals.

("Actions" here are tool calls waiting for someone outside the run; the
collection writes of ``ctx.db.actions`` are another thing, see database.py.)

When the model calls a client-routed tool, or a tool that needs approval, the
run journals an ``action_requested`` event and suspends. A client answers with
``rt.submit_tool_result`` / ``rt.fail_action`` / ``rt.cancel_action`` (client
tools) or ``rt.approve`` / ``rt.deny`` (approvals), and ``rt.cancel_action``
or ``rt.skip_action`` (the call is not run; the model gets a synthetic output
saying so) for either. An answer is checked here, before anything is written:

* the action must still be pending and of the right kind;
* the answering identity must be authorised (by default: the identity of the
  message that started the run; ``client_data`` is never used);
* a submitted output must match the tool's output schema, and an edited input
  the tool's input schema; otherwise the answer is refused and the action stays
  pending.

Client-supplied JSON Schemas are untrusted: see :func:`check_client_tools` for
what they may contain, and :func:`_validator` for how every schema is evaluated.

It is then appended by one script that settles the action at most once, so of
two concurrent answers exactly one wins, and the entity is woken: the same run
continues where it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jsonschema_rs
import msgspec

from .blocks import TOOL_NAME
from .config import Settings
from .errors import (
    ActionError,
    ActionNotAuthorizedError,
    ActionNotPendingError,
    ActionValidationError,
    ClientToolsError,
)
from .events import ActionRequested, ActionSettled
from .json_values import json_builtins

Authorizer = Callable[[ActionRequested, dict[str, str] | None], bool]

__all__ = [  # the errors live in errors.py; re-exported here for existing imports
    "ActionError",
    "ActionNotAuthorizedError",
    "ActionNotPendingError",
    "ActionValidationError",
    "Authorizer",
    "ClientToolsError",
    "answer_event",
    "caller",
    "check_answer",
    "check_answerer",
    "check_client_tools",
    "default_authorizer",
    "expired",
]


def default_authorizer(action: ActionRequested, identity: dict[str, str] | None) -> bool:
    """Only the identity that started the run may answer (anyone, if it had none)."""
    return action.authorized is None or identity == action.authorized


def check_answer(
    action: ActionRequested,
    url: str,
    tool_call_id: str,
    decision: str,
    *,
    output: Any = None,
    edited_input: Any = None,
) -> None:
    """Raise an ActionError naming what is wrong with this answer to a pending call.
    Called after :func:`check_answerer`: a caller who may not answer learns nothing more
    of the call (its kind, its schemas) from the refusal."""
    allowed = {
        "client": {"output", "failed", "cancelled", "skipped"},
        "approval": {"approved", "denied", "cancelled", "skipped"},
    }
    if decision not in allowed[action.kind]:
        verbs = {
            "output": "submit an output to",
            "failed": "fail",
            "approved": "approve",
            "denied": "deny",
        }
        raise ActionError(
            f"cannot {verbs.get(decision, decision)} tool call {tool_call_id!r} of {url}: "
            f"it waits for {'a client tool result' if action.kind == 'client' else 'an approval'}"
        )
    if decision == "output" and action.output_schema is not None:
        _validate(
            output, action.output_schema, f"output for tool call {tool_call_id!r} ({action.tool})"
        )
    if edited_input is not None and action.input_schema is not None:
        _validate(
            edited_input,
            action.input_schema,
            f"edited input for tool call {tool_call_id!r} ({action.tool})",
        )


def check_answerer(
    action: ActionRequested | None,
    url: str,
    tool_call_id: str,
    identity: dict[str, str] | None,
    authorizer: Authorizer,
) -> None:
    """Raise unless the call is pending and ``identity`` may answer it."""
    if action is None:
        raise ActionNotPendingError(
            f"{url} has no pending action for tool call {tool_call_id!r} "
            "(unknown, or answered already)"
        )
    if not authorizer(action, identity):
        raise ActionNotAuthorizedError(
            f"{caller(identity)} may not answer tool call {tool_call_id!r} of {url}"
        )


def caller(identity: dict[str, str] | None) -> str:
    """Who asked, for a refusal: ``identity {"user":"alice"}``, or a caller without one."""
    if not identity:
        return "a caller without an identity"
    return f"identity {json.dumps(identity, sort_keys=True, ensure_ascii=False)}"


def _validate(value: Any, schema: dict[str, Any], what: str) -> None:
    plain = json_builtins(value, what)
    try:
        validator = _validator(schema)
    except ValueError as exc:  # not usable (a schema stored before the send-time checks)
        raise ActionValidationError(
            f"{what}: its schema cannot be used: {_first_line(exc)}"
        ) from None
    try:
        validator.validate(plain)
    except jsonschema_rs.ValidationError as exc:
        where = "/".join(str(p) for p in exc.instance_path) or "the top level"
        raise ActionValidationError(
            f"{what} does not match its schema at {where}: {exc.message}"
        ) from None


# -- evaluating schemas ----------------------------------------------------------------

REGEX_BACKTRACK_LIMIT = 100_000
"""Patterns run on a Rust regex engine: ordinary patterns (``^(a+)+$`` too) in linear
time; lookarounds and backreferences by bounded backtracking, this many steps at
most, so no pattern can hold the event loop."""


def _no_retrieval(uri: str) -> Any:
    raise ValueError(f"{uri} is outside the schema: only references within it resolve")


def _validator(schema: dict[str, Any]) -> jsonschema_rs.Draft202012Validator:
    """A validator for ``schema`` that never reads a file or the network (every
    ``$ref`` resolves within the schema or fails) and runs patterns in bounded time.
    Raises ValueError (a jsonschema_rs.ValidationError) for a schema it cannot use."""
    return jsonschema_rs.Draft202012Validator(
        schema,
        retriever=_no_retrieval,
        validate_formats=False,
        pattern_options=jsonschema_rs.FancyRegexOptions(backtrack_limit=REGEX_BACKTRACK_LIMIT),
    )


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def answer_event(
    tool_call_id: str,
    decision: str,
    identity: dict[str, str] | None,
    *,
    output: Any = None,
    error: str | None = None,
    edited_input: Any = None,
) -> ActionSettled:
    return ActionSettled(
        tool_call_id=tool_call_id,
        decision=decision,  # type: ignore[arg-type]
        output=msgspec.to_builtins(output),
        error=error,
        edited_input=msgspec.to_builtins(edited_input),
        by=identity,
        at_ms=int(time.time() * 1000),
    )


def expired(action: ActionRequested) -> bool:
    return bool(action.expires_ms) and time.time() * 1000 > action.expires_ms


# -- frontend-defined client tools --------------------------------------------------

RESERVED_PREFIX = "wakeful"
RESERVED_NAMES = frozenset(  # the runtime tools' names (runtime_tools)
    {
        "send_message",
        "spawn_agent",
        "schedule_message",
        "upsert_cron_schedule",
        "list_schedules",
        "delete_schedule",
    }
)
_NAME = TOOL_NAME  # the Messages API's rule for tool names


def check_client_tools(snapshot: Any, settings: Settings | None = None) -> list[dict[str, Any]]:
    """Validate a client's tool definitions (name, description, input/output JSON Schemas).

    The schemas come from the client, so they are held to the limits of
    ``settings``: at most ``max_client_tools`` tools, each schema at most
    ``max_schema_bytes`` (as JSON) and ``max_schema_depth`` levels deep, and
    every ``$ref`` local to its schema (``#...``): nothing is read from a file
    or the network. Returns the tools as plain dicts. Raises ClientToolsError
    naming the tool and the problem; nothing is sent then.
    """
    limits = settings or Settings()
    if not isinstance(snapshot, list):
        raise ClientToolsError(
            f"client_tools must be a list of tool definitions, got {type(snapshot).__name__}"
        )
    if len(snapshot) > limits.max_client_tools:
        raise ClientToolsError(
            f"client_tools has {len(snapshot)} tools, over the limit of {limits.max_client_tools}"
        )
    seen: set[str] = set()
    tools = []
    for index, raw in enumerate(snapshot):
        where = f"client_tools[{index}]"
        if not isinstance(raw, dict):
            raise ClientToolsError(f"{where} must be an object, got {type(raw).__name__}")
        unknown = set(raw) - {"name", "description", "input_schema", "output_schema"}
        if unknown:
            raise ClientToolsError(f"{where} has unknown fields: {', '.join(sorted(unknown))}")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ClientToolsError(
                f"{where}: name {name!r} must be 1-64 characters of a-z A-Z 0-9 _ -"
            )
        if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIX):
            raise ClientToolsError(f"{where}: the name {name!r} is reserved by the runtime")
        if name in seen:
            raise ClientToolsError(f"{where}: two client tools are named {name!r}")
        seen.add(name)
        if not isinstance(raw.get("description", ""), str):
            raise ClientToolsError(f"{where} ({name}): description must be a string")
        for field in ("input_schema", "output_schema"):
            schema = raw.get(field)
            if schema is None and field == "output_schema":
                continue
            if not isinstance(schema, dict):
                raise ClientToolsError(f"{where} ({name}): {field} must be a JSON Schema object")
            _check_schema(schema, f"{where} ({name}): {field}", limits)
        if raw["input_schema"].get("type") != "object":
            raise ClientToolsError(f"{where} ({name}): input_schema must have type 'object'")
        tools.append(dict(raw))
    return tools


def _check_schema(schema: dict[str, Any], where: str, limits: Settings) -> None:
    _check_schema_tree(schema, where, limits.max_schema_depth)
    size = _json_size(schema, where)
    if size > limits.max_schema_bytes:
        raise ClientToolsError(
            f"{where} is {size} bytes as JSON, over the limit of {limits.max_schema_bytes}"
        )
    try:
        _validator(schema)
    except ValueError as exc:
        raise ClientToolsError(f"{where} is not a valid JSON Schema: {_first_line(exc)}") from None


def _json_size(value: Any, what: str) -> int:
    try:
        return len(msgspec.json.encode(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ClientToolsError(f"{what} is not JSON: {exc}") from None


def _check_schema_tree(schema: dict[str, Any], where: str, max_depth: int) -> None:
    """Refuse a reference that leaves the schema, and nesting deeper than ``max_depth``."""
    stack: list[tuple[Any, int, str]] = [(schema, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise ClientToolsError(
                f"{where} is nested deeper than {max_depth} levels (at {path or '/'})"
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            local = isinstance(value, str) and value.startswith("#")
            if key in ("$ref", "$dynamicRef") and isinstance(node, dict) and not local:
                raise ClientToolsError(
                    f"{where}: {key} {value!r} at {path or '/'} points outside the "
                    "schema; only references within it (starting with '#') are allowed"
                )
            if isinstance(value, dict | list):
                stack.append((value, depth + 1, f"{path}/{key}"))
