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

Both styles run on the same loop: a resolved agent is a list of ``AgentTool``s.

Failures: ``ctx.fail(message, data)`` is a *planned* failure (the model gets an
error result, the run goes on). Any other exception, an output that breaks the
output schema, or an ``on_output`` that raises is a *bug*: the run fails, the
traceback stays in the log, and clients see a redacted error.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import traceback
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

import msgspec

from .agent_tools import AgentTool, Content, ToolResult, struct_schema
from .cancellation import CancelSignal
from .errors import ToolBugError, ToolContractError, ToolFailure

if TYPE_CHECKING:
    from .context import HandlerContext
    from .models import Model

In = TypeVar("In")
Out = TypeVar("Out")
Ctx = TypeVar("Ctx")


# -- capabilities -------------------------------------------------------------------


@dataclass(frozen=True)
class Capability(Generic[Out]):
    """A lifecycle-bound resource (a sandbox per conversation, a browser per user).

    Bound when the runtime is created (``Runtime(capabilities=[...])``),
    provisioned lazily per entity on first use by a tool that declares it, and
    cleaned up when the entity is deleted or evicted from the worker's cache,
    and when the worker shuts down.
    """

    name: str
    provision: Callable[[str], Awaitable[Out]]  # entity url -> resource
    cleanup: Callable[[Out], Awaitable[None]] | None = None


class CapabilityPool:
    """The capabilities of one entity on one worker: provisioned once, on first use."""

    def __init__(self, url: str, bound: Mapping[str, Capability[Any]]) -> None:
        self.url = url
        self._bound = bound
        self._resources: dict[str, asyncio.Future[Any]] = {}

    @property
    def bound(self) -> set[str]:
        return set(self._bound)

    async def get(self, name: str) -> Any:
        if name not in self._resources:  # one provisioning even for concurrent first uses
            self._resources[name] = asyncio.ensure_future(self._bound[name].provision(self.url))
        return await self._resources[name]

    async def cleanup(self) -> None:
        """Release every provisioned resource (entity deleted or evicted, worker stopping)."""
        resources, self._resources = self._resources, {}
        for name, future in resources.items():
            cleanup = self._bound[name].cleanup
            if cleanup is None or not future.done() or future.exception() is not None:
                continue
            try:
                await cleanup(future.result())
            except Exception:
                logging.getLogger("wakeful.capabilities").exception(
                    "cleanup of capability %r of %s failed", name, self.url
                )


class Capabilities:
    """``ctx.capabilities``: the provisioned resources, by name."""

    def __init__(self, resources: Mapping[str, Any]) -> None:
        self._resources = dict(resources)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._resources[name]
        except KeyError:
            known = ", ".join(sorted(self._resources)) or "none"
            raise AttributeError(
                f"capability {name!r} was not declared by this tool (declared: {known})"
            ) from None


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

    def update(self, progress: Any) -> None:
        """Report progress; clients see it live."""
        self._on_update(progress)

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


def tool(**options: Any) -> Callable[[Callable[..., Awaitable[Any]]], ToolDef[Any, Any, Any]]:
    """Decorator form: ``@tool(id=..., description=..., input=..., output=...)``."""

    def decorate(execute: Callable[..., Awaitable[Any]]) -> ToolDef[Any, Any, Any]:
        return define_tool(execute=execute, **options)

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
    """What ``on_output`` receives, once per settled, validated output."""

    input: Any = None
    output: Any = None
    registration: str = ""
    tool_call_id: str = ""


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
    )
    agent.check()
    return agent


# -- resolution: an AgentDef becomes AgentTools for one wake ---------------------------


def resolve_tools(
    agent: AgentDef,
    ctx: HandlerContext,
    caller: Callable[[], tuple[Any, Any]],
    pool: CapabilityPool,
) -> list[AgentTool]:
    """The registrations of ``agent`` as loop tools, bound to this wake.

    ``caller()`` returns ``(identity, client_data)`` of the current run; ``pool``
    holds the entity's capabilities on this worker.
    """
    agent.check(pool.bound)

    def info() -> CallInfo:
        identity, client_data = caller()
        runtime_context = agent.runtime_context(identity) if agent.runtime_context else None
        return CallInfo(runtime_context, identity, client_data, ctx.entity_url, ctx.signal)

    return [_adapt(agent, key, reg, ctx, info, pool) for key, reg in agent.registrations().items()]


def loop_result_hook(
    agent: AgentDef, caller: Callable[[], tuple[Any, Any]], ctx: HandlerContext
) -> Callable[[str, str, str], ToolResult | None] | None:
    """``lifecycle.after_tool_result`` for the errors the loop makes itself (unknown or
    disabled tool, bad arguments, interrupted or cut-off call), so it sees every result.
    An error it turns into an output then goes to the registration's ``on_output``."""
    hook = agent.lifecycle.after_tool_result if agent.lifecycle else None
    if hook is None:
        return None
    registrations = agent.registrations()

    def apply(name: str, call_id: str, message: str) -> ToolResult | None:
        outcome = hook(ToolOutcomeInfo(name=name, tool_call_id=call_id, error=message))
        if outcome is None or outcome.error is not None:
            error = outcome.error if outcome is not None and outcome.error is not None else message
            data = outcome.error_data if outcome is not None else None
            return ToolResult(
                error, details={"error": error, "data": msgspec.to_builtins(data)}, is_error=True
            )
        reg = registrations.get(name)
        if reg is not None and reg.on_output is not None:
            identity, client_data = caller()
            runtime_context = agent.runtime_context(identity) if agent.runtime_context else None
            reg.on_output(
                OutputInfo(
                    runtime_context,
                    identity,
                    client_data,
                    ctx.entity_url,
                    ctx.signal,
                    input=None,
                    output=outcome.output,
                    registration=name,
                    tool_call_id=call_id,
                )
            )
        stored = msgspec.to_builtins(outcome.output)
        return ToolResult(json.dumps(stored, ensure_ascii=False), details={"output": stored})

    return apply


def _adapt(
    agent: AgentDef,
    key: str,
    reg: Registration[Any, Any, Any],
    ctx: HandlerContext,
    info: Callable[[], CallInfo],
    pool: CapabilityPool,
) -> AgentTool:
    definition = reg.tool

    async def enabled() -> bool:
        if isinstance(reg.enabled, bool):
            return reg.enabled
        verdict = reg.enabled(info())
        return bool(await verdict if inspect.isawaitable(verdict) else verdict)

    async def execute(call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
        if definition.execute is None:
            raise ToolBugError(
                f"tool {key!r} is client-routed and cannot run on the server",
                f"tool {definition.id!r} has no execute",
            )
        call = info()
        if definition.context is None:
            tool_context = None
        elif reg.map_context is not None:
            tool_context = reg.map_context(call.runtime_context, call.identity, call.client_data)
        else:
            tool_context = call.runtime_context
        resources = {name: await pool.get(name) for name in sorted(definition.capabilities)}
        tool_ctx = ToolContext(
            params, tool_context, signal, call_id, Capabilities(resources), on_update
        )
        outcome = ToolOutcomeInfo(name=key, tool_call_id=call_id)
        try:
            outcome.output = await definition.execute(tool_ctx)
        except ToolFailure as failure:
            outcome.error, outcome.error_data = failure.message, failure.data
        except Exception as exc:
            raise _bug(key, call_id, "".join(traceback.format_exception(exc))) from exc
        return await settle(call, call_id, params, outcome)

    async def accept_output(call_id: str, raw_input: Any, output: Any) -> ToolResult:
        """A client's submitted output (already checked against the output schema)."""
        try:
            params = msgspec.convert(raw_input, definition.input)
        except (msgspec.ValidationError, TypeError):
            params = raw_input
        outcome = ToolOutcomeInfo(name=key, tool_call_id=call_id, output=output)
        return await settle(info(), call_id, params, outcome)

    async def settle(
        call: CallInfo, call_id: str, params: Any, outcome: ToolOutcomeInfo
    ) -> ToolResult:
        """Validate the output, apply the lifecycle hook, observe, project for the model."""
        if outcome.error is None and definition.output is not None:
            try:
                outcome.output = msgspec.convert(
                    msgspec.to_builtins(outcome.output), definition.output
                )
            except (msgspec.ValidationError, TypeError) as exc:
                detail = f"output does not match {definition.output.__name__}: {exc}"
                raise _bug(key, call_id, detail) from exc
        if agent.lifecycle is not None and agent.lifecycle.after_tool_result is not None:
            changed = agent.lifecycle.after_tool_result(outcome)
            outcome = changed if changed is not None else outcome
        if outcome.error is not None:
            return ToolResult(
                outcome.error,
                details={"error": outcome.error, "data": msgspec.to_builtins(outcome.error_data)},
                is_error=True,
            )
        if reg.on_output is not None:
            observed = OutputInfo(
                **vars(call),
                input=params,
                output=outcome.output,
                registration=key,
                tool_call_id=call_id,
            )
            try:
                reg.on_output(observed)
            except Exception as exc:
                raise _bug(key, call_id, "".join(traceback.format_exception(exc))) from exc
        stored = msgspec.to_builtins(outcome.output)
        if definition.to_model_output is not None:
            content = definition.to_model_output(outcome.output)
        else:
            content = json.dumps(stored, ensure_ascii=False)
        return ToolResult(content, details={"output": stored})

    async def needs_approval(call_id: str, params: Any) -> bool:
        if isinstance(reg.needs_approval, bool):
            return reg.needs_approval
        verdict = reg.needs_approval(
            ApprovalInfo(**vars(info()), input=params, tool_call_id=call_id)
        )
        return bool(await verdict if inspect.isawaitable(verdict) else verdict)

    return AgentTool(
        name=key,
        description=definition.description,
        parameters=definition.input,
        execute=execute,
        label=definition.id,
        enabled=enabled,
        client_routed=definition.client_routed,
        output_schema=struct_schema(definition.output) if definition.output is not None else None,
        accept_output=accept_output,
        needs_approval=needs_approval,
        action_ttl=reg.action_ttl,
    )


def _bug(key: str, call_id: str, detail: str) -> ToolBugError:
    return ToolBugError(f"internal error in tool {key!r} (call {call_id})", detail)


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
    "Capabilities",
    "Capability",
    "CapabilityPool",
    "Lifecycle",
    "OutputInfo",
    "Registration",
    "ToolContext",
    "ToolContractError",  # in errors.py; re-exported here for existing imports
    "ToolDef",
    "ToolFailure",  # in errors.py; re-exported here for existing imports
    "ToolOutcomeInfo",
    "define_agent",
    "define_tool",
    "tool",
]
