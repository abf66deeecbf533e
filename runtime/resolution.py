"""Resolution: an agent definition (``define_agent``) becomes loop tools for one wake.

Each registration of a typed agent turns into an :class:`AgentTool` bound to the
wake's context: its resolvers (``enabled``, ``needs_approval``) and observers
(``on_output``, ``lifecycle.after_tool_result``) get the call's info, its
``execute`` gets a :class:`ToolContext`, and its output is validated against the
output schema. A planned failure (``ctx.fail``) becomes an error result for the
model; anything else a tool raises is a bug (:class:`ToolBugError`): the run fails.
"""

from __future__ import annotations

import inspect
import json
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from .agent_tools import AgentTool, ToolResult, struct_schema
from .capabilities import Capabilities, CapabilityPool
from .contracts import (
    AgentDef,
    ApprovalInfo,
    CallInfo,
    OutputInfo,
    Registration,
    ToolContext,
    ToolOutcomeInfo,
    tool_context_value,
)
from .errors import ToolBugError, ToolFailure

if TYPE_CHECKING:
    from .context import HandlerContext

__all__ = ["loop_result_hook", "resolve_tools", "resolved"]

T = TypeVar("T")


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

    async def info() -> CallInfo:
        identity, client_data = caller()
        runtime_context = (
            await resolved(agent.runtime_context(identity)) if agent.runtime_context else None
        )
        return CallInfo(runtime_context, identity, client_data, ctx.entity_url, ctx.signal)

    return [
        _BoundRegistration(agent, key, reg, info, pool).tool()
        for key, reg in agent.registrations().items()
    ]


def loop_result_hook(
    agent: AgentDef, caller: Callable[[], tuple[Any, Any]], ctx: HandlerContext
) -> Callable[[str, str, str], Awaitable[ToolResult | None]] | None:
    """``lifecycle.after_tool_result`` for the errors the loop makes itself (unknown or
    disabled tool, bad arguments, interrupted or cut-off call), so it sees every result.
    An error it turns into an output then goes to the registration's ``on_output``."""
    hook = agent.lifecycle.after_tool_result if agent.lifecycle else None
    if hook is None:
        return None
    registrations = agent.registrations()

    async def apply(name: str, call_id: str, message: str) -> ToolResult | None:
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
            runtime_context = (
                await resolved(agent.runtime_context(identity)) if agent.runtime_context else None
            )
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


class _BoundRegistration:
    """One registration of a typed agent, bound to a wake: the parts of its AgentTool."""

    def __init__(
        self,
        agent: AgentDef,
        key: str,
        reg: Registration[Any, Any, Any],
        info: Callable[[], Awaitable[CallInfo]],
        pool: CapabilityPool,
    ) -> None:
        self.agent = agent
        self.key = key
        self.reg = reg
        self.definition = reg.tool
        self.info = info
        self.pool = pool

    def tool(self) -> AgentTool:
        definition = self.definition
        return AgentTool(
            name=self.key,
            description=definition.description,
            parameters=definition.input,
            execute=self.execute,
            label=definition.id,
            id=definition.id,
            rerun_when_in_doubt=self.reg.reruns_in_doubt,
            enabled=self.enabled,
            client_routed=definition.client_routed,
            output_schema=(
                struct_schema(definition.output) if definition.output is not None else None
            ),
            accept_output=self.accept_output,
            needs_approval=self.needs_approval,
            action_ttl=self.reg.action_ttl,
        )

    async def enabled(self) -> bool:
        enabled = self.reg.enabled
        if isinstance(enabled, bool):
            return enabled
        return bool(await resolved(enabled(await self.info())))

    async def needs_approval(self, call_id: str, params: Any) -> bool:
        needs = self.reg.needs_approval
        if isinstance(needs, bool):
            return needs
        info = await self.info()
        return bool(
            await resolved(needs(ApprovalInfo(**vars(info), input=params, tool_call_id=call_id)))
        )

    async def execute(self, call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
        definition, key = self.definition, self.key
        if definition.execute is None:
            raise ToolBugError(
                f"tool {key!r} is client-routed and cannot run on the server",
                f"tool {definition.id!r} has no execute",
            )
        call = await self.info()
        if definition.context is None:
            tool_context = None
        elif self.reg.map_context is not None:
            tool_context = await resolved(
                self.reg.map_context(call.runtime_context, call.identity, call.client_data)
            )
        else:
            tool_context = tool_context_value(definition.context, call.runtime_context)
        resources = {name: await self.pool.get(name) for name in sorted(definition.capabilities)}
        tool_ctx = ToolContext(
            params, tool_context, signal, call_id, Capabilities(resources), on_update
        )
        outcome = ToolOutcomeInfo(name=key, tool_call_id=call_id)
        try:
            outcome.output = await definition.execute(tool_ctx)
        except ToolFailure as failure:
            outcome.error, outcome.error_data = failure.message, failure.data
        except Exception as exc:  # a bug (WakeInterrupted, a BaseException, passes)
            raise _bug(key, call_id, "".join(traceback.format_exception(exc))) from exc
        return await self.settle(call, call_id, params, outcome)

    async def accept_output(self, call_id: str, raw_input: Any, output: Any) -> ToolResult:
        """A client's submitted output (already checked against the output schema)."""
        try:
            params = msgspec.convert(raw_input, self.definition.input)
        except (msgspec.ValidationError, TypeError):
            params = raw_input
        outcome = ToolOutcomeInfo(name=self.key, tool_call_id=call_id, output=output)
        return await self.settle(await self.info(), call_id, params, outcome)

    async def settle(
        self, call: CallInfo, call_id: str, params: Any, outcome: ToolOutcomeInfo
    ) -> ToolResult:
        """Validate the output, apply the lifecycle hook, observe, project for the model."""
        definition, key, lifecycle = self.definition, self.key, self.agent.lifecycle
        if outcome.error is None and definition.output is not None:
            try:
                outcome.output = msgspec.convert(
                    msgspec.to_builtins(outcome.output), definition.output
                )
            except (msgspec.ValidationError, TypeError) as exc:
                detail = f"output does not match {definition.output.__name__}: {exc}"
                raise _bug(key, call_id, detail) from exc
        if lifecycle is not None and lifecycle.after_tool_result is not None:
            changed = lifecycle.after_tool_result(outcome)
            outcome = changed if changed is not None else outcome
        if outcome.error is not None:
            return ToolResult(
                outcome.error,
                details={"error": outcome.error, "data": msgspec.to_builtins(outcome.error_data)},
                is_error=True,
            )
        if self.reg.on_output is not None:
            observed = OutputInfo(
                **vars(call),
                input=params,
                output=outcome.output,
                registration=key,
                tool_call_id=call_id,
            )
            try:
                self.reg.on_output(observed)
            except Exception as exc:
                raise _bug(key, call_id, "".join(traceback.format_exception(exc))) from exc
        stored = msgspec.to_builtins(outcome.output)
        if definition.to_model_output is not None:
            content = definition.to_model_output(outcome.output)
        else:
            content = json.dumps(stored, ensure_ascii=False)
        return ToolResult(content, details={"output": stored})


async def resolved(value: T | Awaitable[T]) -> T:
    """A resolver's answer: awaited if the resolver is ``async`` (any resolver may be)."""
    if inspect.isawaitable(value):
        return await value
    return value


def _bug(key: str, call_id: str, detail: str) -> ToolBugError:
    return ToolBugError(f"internal error in tool {key!r} (call {call_id})", detail)
