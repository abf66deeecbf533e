"""Resolution: an agent definition (``define_agent``) becomes loop tools for one wake.

Each registration of a typed agent turns into an :class:`AgentTool` bound to the
wake's context: its resolvers (``enabled``, ``needs_approval``) and observers
(``on_output``, ``lifecycle.after_tool_result``) get the call's info, its
``execute`` gets a :class:`ToolContext`, and its output is validated against the
output schema. A planned failure (``ctx.fail``) becomes an error result for the
model; anything else a tool raises is a bug (:class:`ToolBugError`): the run fails.
"""

from __future__ import annotations

import copy
import inspect
import json
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from .agent_tools import AgentTool, ToolResult, struct_schema
from .capabilities import Capabilities, CapabilityPool
from .context_fit import tool_context_value
from .contracts import (
    AgentDef,
    ApprovalInfo,
    CallInfo,
    OutputInfo,
    Registration,
    ToolContext,
    ToolOutcomeInfo,
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
        _BoundRegistration(agent, key, reg, info, pool, ctx.set_tool_data).tool()
        for key, reg in agent.registrations().items()
    ]


def loop_result_hook(
    agent: AgentDef, caller: Callable[[], tuple[Any, Any]], ctx: HandlerContext
) -> Callable[[str, str, str, Any], Awaitable[ToolResult | None]] | None:
    """``lifecycle.after_tool_result`` for the errors the loop makes itself (unknown or
    disabled tool, bad arguments, interrupted or cut-off call), so it sees every result.
    An error it turns into an output is settled as any output of the registration:
    validated, then observed by ``on_output`` with the call's input."""
    hook = agent.lifecycle.after_tool_result if agent.lifecycle else None
    if hook is None:
        return None
    registrations = agent.registrations()

    async def info() -> CallInfo:
        identity, client_data = caller()
        runtime_context = (
            await resolved(agent.runtime_context(identity)) if agent.runtime_context else None
        )
        return CallInfo(runtime_context, identity, client_data, ctx.entity_url, ctx.signal)

    async def apply(name: str, call_id: str, message: str, raw_input: Any) -> ToolResult | None:
        outcome = ToolOutcomeInfo(name=name, tool_call_id=call_id, error=message)
        reg = registrations.get(name)
        if reg is not None:
            bound = _BoundRegistration(agent, name, reg, info, None)
            return await bound.settle(await info(), call_id, bound.typed_input(raw_input), outcome)
        changed = await _after(hook, outcome)  # a name no registration has: no schema
        if changed.error is not None:
            return _error_result(changed)
        stored = msgspec.to_builtins(changed.output)
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
        pool: CapabilityPool | None,
        set_data: Callable[[str, Any], None] = lambda call_id, data: None,
    ) -> None:
        self.set_data = set_data
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
            observe_skip=self.observe_skip,
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
        assert self.pool is not None  # a registration bound for the loop hook never runs
        resources = {name: await self.pool.get(name) for name in sorted(definition.capabilities)}
        tool_ctx = ToolContext(
            params,
            tool_context,
            signal,
            call_id,
            Capabilities(resources),
            on_update,
            lambda data: self.set_data(call_id, data),
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
        outcome = ToolOutcomeInfo(name=self.key, tool_call_id=call_id, output=output)
        return await self.settle(await self.info(), call_id, self.typed_input(raw_input), outcome)

    async def observe_skip(self, call_id: str, raw_input: Any, synthetic: Any) -> None:
        """A skipped call: ``on_output`` sees the synthetic output the model is given
        (not validated: it is the runtime's, not the tool's)."""
        await self.observe(await self.info(), call_id, self.typed_input(raw_input), synthetic, True)

    def typed_input(self, raw_input: Any) -> Any:
        """The call's input as the tool's input type, or as given if it does not fit
        (a call refused for its bad arguments still reaches the observers)."""
        try:
            return msgspec.convert(raw_input, self.definition.input)
        except (msgspec.ValidationError, TypeError):
            return raw_input

    async def settle(
        self, call: CallInfo, call_id: str, params: Any, outcome: ToolOutcomeInfo
    ) -> ToolResult:
        """Apply the lifecycle hook, validate the output, observe it, project it.

        The output is validated after ``after_tool_result``, so what the observers and
        the model get always matches the output schema; an output that does not is a
        bug. ``on_output`` gets its own copy: it cannot change the stored result or
        what the model sees."""
        definition, key, lifecycle = self.definition, self.key, self.agent.lifecycle
        if lifecycle is not None and lifecycle.after_tool_result is not None:
            outcome = await _after(lifecycle.after_tool_result, outcome)
        if outcome.error is not None:
            return _error_result(outcome)
        output = outcome.output
        if definition.output is not None:
            try:
                output = msgspec.convert(msgspec.to_builtins(output), definition.output)
            except (msgspec.ValidationError, TypeError) as exc:
                detail = f"output does not match {definition.output.__name__}: {exc}"
                raise _bug(key, call_id, detail) from exc
        stored = msgspec.to_builtins(output)
        await self.observe(call, call_id, params, _copy_of(stored, definition.output, output))
        if definition.to_model_output is not None:
            content = definition.to_model_output(output)
        else:
            content = json.dumps(stored, ensure_ascii=False)
        return ToolResult(content, details={"output": stored})

    async def observe(
        self, call: CallInfo, call_id: str, params: Any, output: Any, skipped: bool = False
    ) -> None:
        """Run ``on_output`` (sync or async) on its own copy; what it raises is a bug."""
        if self.reg.on_output is None:
            return
        observed = OutputInfo(
            **vars(call),
            input=copy.deepcopy(params),
            output=output,
            registration=self.key,
            tool_call_id=call_id,
            skipped=skipped,
        )
        try:
            seen = self.reg.on_output(observed)
            if inspect.isawaitable(seen):
                await seen
        except Exception as exc:
            raise _bug(self.key, call_id, "".join(traceback.format_exception(exc))) from exc


async def _after(
    hook: Callable[[ToolOutcomeInfo], Any], outcome: ToolOutcomeInfo
) -> ToolOutcomeInfo:
    """``lifecycle.after_tool_result`` (sync or async): the outcome it returns, or the
    one it was given (changed in place, or not at all) when it returns None."""
    changed = hook(outcome)
    if inspect.isawaitable(changed):
        changed = await changed
    return changed if changed is not None else outcome


def _error_result(outcome: ToolOutcomeInfo) -> ToolResult:
    error = outcome.error or "the tool failed"
    return ToolResult(
        error,
        details={"error": error, "data": msgspec.to_builtins(outcome.error_data)},
        is_error=True,
    )


def _copy_of(stored: Any, output_type: type | None, output: Any) -> Any:
    """A fresh copy of a settled output for an observer (decoded again from the stored
    JSON for a typed output, so no object of the stored result is shared)."""
    if output_type is not None:
        return msgspec.convert(stored, output_type)
    return copy.deepcopy(output)


async def resolved(value: T | Awaitable[T]) -> T:
    """A resolver's answer: awaited if the resolver is ``async`` (any resolver may be)."""
    if inspect.isawaitable(value):
        return await value
    return value


def _bug(key: str, call_id: str, detail: str) -> ToolBugError:
    return ToolBugError(
        f"internal error in tool {key!r} (call {call_id})", detail, tool=key, tool_call_id=call_id
    )
