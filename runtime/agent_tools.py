"""What a tool of the agent loop is: :class:`AgentTool` and what it returns.

The plain tool style (``AgentTool``) and the typed contracts of ``contracts.py``
both end up as ``AgentTool``s (resolution.py binds the typed ones to a wake); the
loop (``agent.py``, ``agent_calls.py``) only runs these.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from .cancellation import CancelSignal

__all__ = [
    "AgentTool",
    "Content",
    "OnUpdate",
    "RuntimeErrorInfo",
    "ToolResult",
    "content_blocks",
    "struct_schema",
]

Content = str | list[dict[str, Any]]
OnUpdate = Callable[[Any], None]


@dataclass
class ToolResult:
    """What a tool returns: ``content`` for the model, ``details`` for clients."""

    content: Content
    details: Any = None
    is_error: bool = False


@dataclass(frozen=True)
class RuntimeErrorInfo:
    """What an agent's ``on_runtime_error`` hook receives: a bug that fails the run (an
    exception in ``execute`` or in ``on_output``, an output that breaks its schema).

    ``error`` is the redacted message clients see; ``detail`` is the full error (the
    traceback, secret values included) and ``exception`` the exception itself."""

    entity_url: str
    run_id: str
    tool: str
    tool_call_id: str
    error: str
    detail: str
    exception: BaseException | None = None


@dataclass
class AgentTool:
    """A tool the model can call.

    ``parameters`` is a msgspec Struct type (its JSON Schema is sent to the
    model, and arguments are validated and converted before ``execute``) or a
    JSON Schema dict (arguments are passed as a dict). ``execute`` receives
    ``(tool_call_id, params, signal, on_update)``; ``tool_call_id`` is stable
    across resumes, so a tool can use it as an idempotency key.
    """

    name: str
    description: str
    parameters: type | dict[str, Any]
    execute: Callable[[str, Any, CancelSignal, OnUpdate], Awaitable[ToolResult | Content]]
    label: str = ""  # a display name for clients
    rerun_when_in_doubt: bool = True
    # Checked before every model step (a disabled tool is left out of the request)
    # and before every execution (a call to a disabled tool gets an error result).
    enabled: Callable[[], Awaitable[bool]] | None = None
    # Client-routed: the call becomes a pending action that a client answers
    # (``rt.submit_tool_result``); ``accept_output`` turns a submitted output into
    # the result (typed tools validate it and run their observers there).
    client_routed: bool = False
    output_schema: dict[str, Any] | None = None
    accept_output: Callable[[str, Any, Any], Awaitable[ToolResult]] | None = None
    # A skipped call: observes the synthetic output the model is given (typed tools
    # run ``on_output`` there), given ``(tool_call_id, raw input, synthetic output)``.
    observe_skip: Callable[[str, Any, Any], Awaitable[None]] | None = None
    # Approval: when it answers True (given the call's id and validated arguments)
    # the call waits for rt.approve / rt.deny first.
    needs_approval: Callable[[str, Any], Awaitable[bool]] | None = None
    action_ttl: float | None = None  # a pending action expires (as a failure) after this
    # The stable wire identity, recorded with every persisted call (intent, result,
    # pending action): a call recorded with another id is never run against this tool.
    # Typed tools have their contract's id, client tools ``client:<name>``.
    id: str | None = None
    # Names the tool had before (a call journaled under one still finds it), unless a
    # tool of the agent now has that name.
    former_names: tuple[str, ...] = ()

    async def is_enabled(self) -> bool:
        return True if self.enabled is None else bool(await self.enabled())

    async def wants_approval(self, tool_call_id: str, params: Any) -> bool:
        if self.needs_approval is None:
            return False
        return bool(await self.needs_approval(tool_call_id, params))

    def input_schema(self) -> dict[str, Any]:
        if isinstance(self.parameters, dict):
            return self.parameters
        return struct_schema(self.parameters)

    def parse(self, raw: Any) -> Any:
        """Validated arguments; raises ValueError with a message for the model."""
        if isinstance(self.parameters, dict):
            if not isinstance(raw, dict):
                raise ValueError(f"arguments must be a JSON object, got {type(raw).__name__}")
            return raw
        try:
            return msgspec.convert(raw, self.parameters)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from None

    def manifest(self) -> dict[str, Any]:
        """What ``wakeful manifest`` shows of a tool: its name (the key the model sees),
        id, schemas, and whether a call in doubt is run again."""
        return {
            "key": self.name,
            "id": self.id,
            "description": self.description,
            "input_schema": self.input_schema(),
            "output_schema": self.output_schema,
            "client_routed": self.client_routed,
            "rerun_in_doubt": self.rerun_when_in_doubt,
        }

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema(),
        }


def struct_schema(struct: type) -> dict[str, Any]:
    """JSON Schema of a Struct with the top level inlined (the API wants ``type: object``).

    Made once per type (``msgspec.json.schema`` costs about 0.1-0.7 ms, and a typed
    tool's schema is sent with every model step): the same schema each time, its top
    level a copy of its own."""
    try:
        return dict(_struct_schema(struct))
    except TypeError as exc:  # not hashable: made afresh (or msgspec's own TypeError)
        if "unhashable" not in str(exc):
            raise
        return _make_struct_schema(struct)


@functools.lru_cache(maxsize=1024)
def _struct_schema(struct: type) -> dict[str, Any]:
    return _make_struct_schema(struct)


def _make_struct_schema(struct: type) -> dict[str, Any]:
    schema = msgspec.json.schema(struct)
    ref = schema.pop("$ref", None)
    if ref is None:
        return schema
    defs = schema.pop("$defs", {})
    top = dict(defs.pop(ref.rsplit("/", 1)[-1]))
    if defs:
        top["$defs"] = defs
    return top


def content_blocks(content: Content) -> list[dict[str, Any]]:
    """A tool result's content as Messages API blocks (never empty)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content or "(empty)"}]
    return [dict(b) for b in content] or [{"type": "text", "text": "(empty)"}]
