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
import json
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

import msgspec

from .agent_options import check_agent_options, check_combination, server_tool_spec
from .agent_tools import Content, RuntimeErrorInfo, struct_schema
from .blocks import TOOL_NAME
from .cancellation import CancelSignal
from .capabilities import Capabilities, Capability, CapabilityPool
from .context_fit import context_gap, tool_context_value, type_name
from .errors import ToolContractError, ToolFailure, describe
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
    rerun_in_doubt: bool = False

    @property
    def client_routed(self) -> bool:
        return self.execute is None

    def schemas(self) -> dict[str, Any]:
        """The input and output JSON Schemas (what one id must always mean)."""
        return {
            "input_schema": struct_schema(self.input),
            "output_schema": struct_schema(self.output) if self.output is not None else None,
        }

    def manifest(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "description": self.description,
            **self.schemas(),
            "context": type_name(self.context),
            "capabilities": sorted(self.capabilities),
            "client_routed": self.client_routed,
            "rerun_in_doubt": self.rerun_in_doubt,
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
    rerun_in_doubt: bool = False,
) -> ToolDef[In, Out, Ctx]:
    """Define a tool contract. Without ``execute`` the tool is client-routed.

    ``rerun_in_doubt``: a call interrupted while it ran (the worker stopped before its
    result was committed) is run again, with the same ``tool_call_id``. By default it
    is not: the model is told the call was interrupted. Opt in only for an ``execute``
    that is safe to repeat (idempotent, or keyed by ``tool_call_id``); a registration
    may override it."""
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
        rerun_in_doubt=rerun_in_doubt,
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
    rerun_in_doubt: bool = False,
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
            rerun_in_doubt=rerun_in_doubt,
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
    # Run a call again when in doubt (see define_tool); None: the tool's own setting.
    rerun_in_doubt: bool | None = None

    @property
    def reruns_in_doubt(self) -> bool:
        return self.tool.rerun_in_doubt if self.rerun_in_doubt is None else self.rerun_in_doubt


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
        """The declared return type of the ``runtime_context`` resolver (of its awaited
        value, for an ``async def``)."""
        if self.runtime_context is None:
            return None
        try:
            hints = typing.get_type_hints(self.runtime_context)
        except Exception as exc:  # an annotation that does not resolve (NameError, ...)
            raise ToolContractError(
                f"agent {self.name!r}: the return annotation of runtime_context "
                f"{type_name(self.runtime_context)} cannot be resolved: {exc}"
            ) from None
        return hints.get("return")

    def check(self, bound_capabilities: typing.Collection[str] | None = None) -> None:
        """Raise ToolContractError for a registration that cannot work, before any model call."""
        provided = self.runtime_context_type()
        check_one_contract_per_id(
            (f"agent {self.name!r}, key {key!r}", reg.tool)
            for key, reg in self.registrations().items()
        )
        for key, reg in self.registrations().items():
            needed = reg.tool.context
            if needed is not None and reg.map_context is None:
                gap = context_gap(provided, needed)
                if gap is not None:
                    raise ToolContractError(
                        f"agent {self.name!r}: tool {reg.tool.id!r} registered as {key!r} "
                        f"needs context {type_name(needed)}, but the agent's runtime context "
                        f"is {type_name(provided)} ({gap}); register it with map_context=..."
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
            "runtime_context": type_name(self.runtime_context_type()),
            # The structured answer (output_type) and the API's own tools, if any.
            "output": (
                {"type": output_type.__name__, "schema": struct_schema(output_type)}
                if (output_type := self.options.get("output_type")) is not None
                else None
            ),
            "server_tools": [server_tool_spec(t) for t in self.options.get("server_tools") or []],
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
                    "rerun_in_doubt": reg.reruns_in_doubt,
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
    """Define an agent; use it from a handler with ``ctx.use_agent(agent)``.

    ``options`` are the loop's (``max_steps``, ``max_run_tokens``,
    ``max_output_tokens``, ``tool_concurrency``, the context and request options,
    ``output_type``; see agent_options.py): an unknown or mistyped one, or one the
    others (or the tools) rule out, is a :class:`ToolContractError` here."""
    where = f"define_agent({name!r})"
    check_agent_options(options, where)
    agent = AgentDef(
        name=name,
        instructions=instructions,
        model=model,
        tools=_checked_tools(tools, where),
        runtime_context=runtime_context,
        lifecycle=lifecycle,
        options=options,
        on_runtime_error=on_runtime_error,
    )
    check_combination(options, where, set(agent.tools))
    try:
        agent.check()
    except ToolContractError:
        raise
    except Exception as exc:  # no raw Python error escapes define_agent
        raise ToolContractError(f"{where}: {describe(exc)}") from exc
    return agent


_TOOL_KEY = TOOL_NAME  # the tool names the model APIs accept


def _checked_tools(
    tools: Any, where: str
) -> dict[str, ToolDef[Any, Any, Any] | Registration[Any, Any, Any]]:
    """``tools`` as a dict, each key a valid tool name and each value a tool definition
    or a Registration of one; else a ToolContractError naming the entry."""
    if tools is None:
        return {}
    if not isinstance(tools, Mapping):
        raise ToolContractError(
            f"{where}: tools must map keys (the names the model sees) to define_tool(...) "
            f"or Registration(...), got {type(tools).__name__}"
        )
    for key, value in tools.items():
        if not isinstance(key, str) or not _TOOL_KEY.fullmatch(key):
            raise ToolContractError(
                f"{where}: tool key {key!r} must be 1 to 64 letters, digits, '_' or '-'"
            )
        definition = value.tool if isinstance(value, Registration) else value
        if not isinstance(definition, ToolDef):
            raise ToolContractError(
                f"{where}: tool {key!r} must be define_tool(...) or Registration(...), got "
                f"{type(definition).__name__} (plain AgentTools go to use_agent(tools=[...]))"
            )
    return dict(tools)


def check_one_contract_per_id(
    definitions: typing.Iterable[tuple[str, ToolDef[Any, Any, Any]]],
) -> None:
    """Raise ToolContractError if one tool id comes with two different input or output
    schemas among ``definitions`` (``(where, definition)`` pairs)."""
    first: dict[str, tuple[str, dict[str, Any]]] = {}
    for where, definition in definitions:
        schemas = definition.schemas()
        seen = first.setdefault(definition.id, (where, schemas))
        for part in ("input_schema", "output_schema"):
            if seen[1][part] != schemas[part]:
                raise ToolContractError(
                    f"tool id {definition.id!r} has two different {part.replace('_', ' ')}s "
                    f"({seen[0]}: {json.dumps(seen[1][part], sort_keys=True)}; {where}: "
                    f"{json.dumps(schemas[part], sort_keys=True)}); one id is one contract, "
                    "give a changed contract a new id"
                )


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
    "check_one_contract_per_id",
    "context_gap",
    "define_agent",
    "define_tool",
    "tool",
    "tool_context_value",
]
