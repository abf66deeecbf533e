"""Typed tool contracts: ``define_tool``, ``Registration``, ``define_agent``.

A *tool definition* is a portable contract: a stable wire ``id``, an input and
an output schema (msgspec Structs), the context it needs, the capabilities it
uses, and ``execute``. An *agent definition* registers tools under keys (the
names the model sees), with per-registration options:

* ``enabled``: a bool or a resolver, evaluated before every model step and
  before every execution (a disabled tool is not offered and cannot run);
* ``map_context``: builds the tool's declared context from the agent's runtime
  context, the trusted identity and the untrusted client data;
* ``on_output``: observes each settled, validated output before the model sees it.

Both styles run on the same loop: a resolved agent is a list of ``AgentTool``s
(resolution.py binds the registrations to a wake).

Failures: ``ctx.fail(message, data)`` is a *planned* failure (the model gets an
error result, the run goes on). Any other exception, an output that breaks the
output schema, or an ``on_output`` that raises is a *bug*: the run fails, clients
see a redacted error, and the full error goes to operators only (the agent's
``on_runtime_error`` hook, the worker log, a ``runtime_error`` event the gateway
never sends).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

import msgspec

from .agent_tools import Content, RuntimeErrorInfo, struct_schema
from .cancellation import CancelSignal
from .capabilities import Capabilities, Capability, CapabilityPool
from .errors import ToolContractError, ToolFailure
from .models import Model

In = TypeVar("In")
Out = TypeVar("Out")
Ctx = TypeVar("Ctx")


# -- tool definitions ----------------------------------------------------------------


@dataclass
class ToolContext(Generic[In, Ctx]):
    """What ``execute`` receives."""

    input: In
    context: Ctx
    signal: CancelSignal
    tool_call_id: str
    capabilities: Capabilities
    _on_update: Callable[[Any], None]
    _set_data: Callable[[Any], None] = lambda data: None

    def update(self, progress: Any) -> None:
        """Report progress; clients see it live."""
        self._on_update(progress)

    def set_data(self, data: Any) -> None:
        """Set this call's tool data: public state that renderers read beside its input
        and output (durable with the call's result; the latest write wins)."""
        self._set_data(data)

    def fail(self, message: str, data: Any = None) -> NoReturn:
        """A planned failure: the model sees ``message`` as a failed result; the run goes on."""
        raise ToolFailure(message, data)


@dataclass(frozen=True)
class ToolDef(Generic[In, Out, Ctx]):
    id: str
    description: str
    input: type[In]
    output: type[Out] | None = None
    context: type[Ctx] | None = None
    capabilities: frozenset[str] = frozenset()
    execute: Callable[[ToolContext[In, Ctx]], Awaitable[Out]] | None = None
    to_model_output: Callable[[Out], Content] | None = None

    @property
    def client_routed(self) -> bool:
        return self.execute is None

    def manifest(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "description": self.description,
            "input_schema": struct_schema(self.input),
            "output_schema": struct_schema(self.output) if self.output is not None else None,
            "context": _type_name(self.context),
            "capabilities": sorted(self.capabilities),
            "client_routed": self.client_routed,
        }


def define_tool(
    *,
    id: str,
    description: str,
    input: type[In],
    output: type[Out] | None = None,
    context: type[Ctx] | None = None,
    capabilities: typing.Iterable[str] = (),
    execute: Callable[[ToolContext[In, Ctx]], Awaitable[Out]] | None = None,
    to_model_output: Callable[[Out], Content] | None = None,
) -> ToolDef[In, Out, Ctx]:
    """Define a tool contract. Without ``execute`` the tool is client-routed."""
    if not isinstance(id, str) or not id.strip():
        raise ToolContractError(f"a tool id must be a non-empty string, got {id!r}")
    for name, value in (("input", input), ("output", output)):
        if value is not None and not (
            isinstance(value, type) and issubclass(value, msgspec.Struct)
        ):
            raise ToolContractError(
                f"tool {id!r}: {name} must be a msgspec Struct type, got {value!r}"
            )
    if execute is not None and not inspect.iscoroutinefunction(execute):
        raise ToolContractError(f"tool {id!r}: execute must be an async function")
    return ToolDef(
        id=id,
        description=description,
        input=input,
        output=output,
        context=context,
        capabilities=frozenset(capabilities),
        execute=execute,
        to_model_output=to_model_output,
    )


def tool(
    *,
    id: str,
    description: str,
    input: type[In],
    output: type[Out] | None = None,
    context: type[Ctx] | None = None,
    capabilities: typing.Iterable[str] = (),
    to_model_output: Callable[[Out], Content] | None = None,
) -> Callable[[Callable[[ToolContext[In, Ctx]], Awaitable[Out]]], ToolDef[In, Out, Ctx]]:
    """Decorator form: ``@tool(id=..., description=..., input=..., output=...)``.

    The decorated function is ``execute``: a checker sees its ``ctx`` as a
    ``ToolContext[input, context]``."""

    def decorate(
        execute: Callable[[ToolContext[In, Ctx]], Awaitable[Out]],
    ) -> ToolDef[In, Out, Ctx]:
        return define_tool(
            id=id,
            description=description,
            input=input,
            output=output,
            context=context,
            capabilities=capabilities,
            execute=execute,
            to_model_output=to_model_output,
        )

    return decorate


# -- registrations and agents ----------------------------------------------------------


@dataclass(frozen=True)
class CallInfo:
    """What resolvers and observers receive."""

    runtime_context: Any
    identity: dict[str, str] | None
    client_data: Any
    entity_url: str
    signal: CancelSignal


@dataclass(frozen=True)
class OutputInfo(CallInfo):
    """What ``on_output`` receives, once per settled, validated output (its own copy:
    changing it changes nothing else). For a skipped call (``skipped``), ``output`` is
    the synthetic output the model is given: ``{"skipped": True, "reason": ...}``."""

    input: Any = None
    output: Any = None
    registration: str = ""
    tool_call_id: str = ""
    skipped: bool = False


@dataclass(frozen=True)
class ApprovalInfo(CallInfo):
    """What a ``needs_approval`` resolver receives: the call info plus the typed input."""

    input: Any = None
    tool_call_id: str = ""


@dataclass
class ToolOutcomeInfo:
    """What ``lifecycle.after_tool_result`` sees (and may change): an output or an error."""

    name: str
    tool_call_id: str
    output: Any = None
    error: str | None = None
    error_data: Any = None


@dataclass(frozen=True)
class Lifecycle:
    after_tool_result: Callable[[ToolOutcomeInfo], ToolOutcomeInfo | None] | None = None


Enabled = bool | Callable[[CallInfo], bool | Awaitable[bool]]


@dataclass(frozen=True)
class Registration(Generic[In, Out, Ctx]):
    tool: ToolDef[In, Out, Ctx]
    enabled: Enabled = True
    map_context: Callable[[Any, dict[str, str] | None, Any], Ctx] | None = None
    on_output: Callable[[OutputInfo], Any] | None = None
    # The call waits for rt.approve / rt.deny first: a bool, or a resolver of ApprovalInfo
    # (the call info plus its typed input), sync or async.
    needs_approval: bool | Callable[[ApprovalInfo], bool | Awaitable[bool]] = False
    # A pending action (client tool or approval) expires as a failure after this many seconds.
    action_ttl: float | None = None


@dataclass(frozen=True)
class AgentDef:
    name: str
    instructions: str
    model: str | Model
    tools: Mapping[str, ToolDef[Any, Any, Any] | Registration[Any, Any, Any]] = field(
        default_factory=dict
    )
    runtime_context: Callable[[dict[str, str] | None], Any] | None = None
    lifecycle: Lifecycle | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    # Told of every bug that fails a run, with the full error (sync or async; what it
    # raises is logged). Clients only ever see the redacted message.
    on_runtime_error: Callable[[RuntimeErrorInfo], Any] | None = None

    def registrations(self) -> dict[str, Registration[Any, Any, Any]]:
        return {
            key: value if isinstance(value, Registration) else Registration(value)
            for key, value in self.tools.items()
        }

    def runtime_context_type(self) -> type | None:
        if self.runtime_context is None:
            return None
        hints = typing.get_type_hints(self.runtime_context)
        return hints.get("return")

    def check(self, bound_capabilities: typing.Collection[str] | None = None) -> None:
        """Raise ToolContractError for a registration that cannot work, before any model call."""
        provided = self.runtime_context_type()
        for key, reg in self.registrations().items():
            needed = reg.tool.context
            if needed is not None and reg.map_context is None and not _satisfies(provided, needed):
                raise ToolContractError(
                    f"agent {self.name!r}: tool {reg.tool.id!r} registered as {key!r} needs "
                    f"context {_type_name(needed)}, but the agent's runtime context is "
                    f"{_type_name(provided)}; register it with map_context=..."
                )
            if bound_capabilities is not None:
                missing = reg.tool.capabilities - set(bound_capabilities)
                if missing:
                    raise ToolContractError(
                        f"agent {self.name!r}: tool {reg.tool.id!r} uses capabilities "
                        f"{sorted(missing)} that the runtime does not bind "
                        "(pass Runtime(capabilities=[...]))"
                    )

    def manifest(self) -> dict[str, Any]:
        model = self.model if isinstance(self.model, str) else getattr(self.model, "name", "?")
        return {
            "name": self.name,
            "model": model,
            "runtime_context": _type_name(self.runtime_context_type()),
            "tools": [
                {
                    "key": key,
                    **reg.tool.manifest(),
                    "enabled": reg.enabled if isinstance(reg.enabled, bool) else "resolver",
                    "map_context": reg.map_context is not None,
                    "on_output": reg.on_output is not None,
                    "needs_approval": reg.needs_approval
                    if isinstance(reg.needs_approval, bool)
                    else "resolver",
                }
                for key, reg in self.registrations().items()
            ],
        }


def define_agent(
    *,
    name: str,
    instructions: str,
    model: str | Model,
    tools: Mapping[str, ToolDef[Any, Any, Any] | Registration[Any, Any, Any]] | None = None,
    runtime_context: Callable[[dict[str, str] | None], Any] | None = None,
    lifecycle: Lifecycle | None = None,
    on_runtime_error: Callable[[RuntimeErrorInfo], Any] | None = None,
    **options: Any,
) -> AgentDef:
    """Define an agent; use it from a handler with ``ctx.use_agent(agent)``."""
    agent = AgentDef(
        name=name,
        instructions=instructions,
        model=model,
        tools=dict(tools or {}),
        runtime_context=runtime_context,
        lifecycle=lifecycle,
        options=options,
        on_runtime_error=on_runtime_error,
    )
    agent.check()
    return agent


def _satisfies(provided: type | None, needed: type) -> bool:
    if provided is None:
        return False
    return provided is needed or (isinstance(provided, type) and issubclass(provided, needed))


def _type_name(value: Any) -> str | None:
    if value is None:
        return None
    return getattr(value, "__name__", repr(value))


__all__ = [
    "AgentDef",
    "ApprovalInfo",
    "CallInfo",
    "Capabilities",  # in capabilities.py; re-exported here for existing imports
    "Capability",
    "CapabilityPool",
    "Lifecycle",
    "OutputInfo",
    "Registration",
    "RuntimeErrorInfo",  # in agent_tools.py; re-exported here
    "ToolContext",
    "ToolContractError",  # in errors.py; re-exported here for existing imports
    "ToolDef",
    "ToolFailure",  # in errors.py; re-exported here for existing imports
    "ToolOutcomeInfo",
    "define_agent",
    "define_tool",
    "tool",
]
