"""The tool calls of the agent loop: settling every call of a model step.

Each call of a journaled step is settled exactly once, by one of: its journaled
result; the answer to its pending tool action (a client's output, or a person's
approval, after which it runs); an error result the loop gives itself (unknown or
disabled tool, bad arguments, cut off, or in doubt and not to be run twice); or
running it. The calls that run get one ``tool_intent`` (committed first), then
run concurrently, each committing its own result (see scope.py).

:class:`ToolCalls` is the part of :class:`~wakeful.agent.Agent` that does this;
the agent's own module keeps the loop over model steps and the end of a run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from . import metrics, tracing
from .activation import Activation
from .agent_tools import AgentTool, Content, ToolResult, content_blocks
from .cancellation import CancelSignal
from .errors import ToolBugError, WakeInterrupted
from .events import (
    ActionRequested,
    ActionSettled,
    AssistantStep,
    Effect,
    LogRecord,
    ToolCall,
    ToolIntent,
    ToolOutcome,
    UserTurn,
)
from .history import tool_uses
from .live import LivePublisher
from .scope import CURRENT_TOOL_CALL
from .state import SystemState
from .tasks import all_of, first_of

Call = tuple[dict[str, Any], AgentTool, Any]  # a call to run: its tool_use block, tool, arguments


class SuspendRun(Exception):
    """Calls of the step wait for pending tool actions: the run suspends (stays open).

    Internal to the agent layer: ``Agent.run`` turns it into a suspended result."""


class StopRun(Exception):
    """The signal fired while the run was waiting (internal, like :class:`SuspendRun`)."""


@dataclass(frozen=True)
class AgentWake:
    """What the agent loop uses of the wake it runs in (``ctx.use_agent`` builds it)."""

    entity_url: str
    inputs: list[LogRecord]  # ctx.wake.events
    activation: Activation  # the loop journals into it; its state holds the journal
    live: LivePublisher  # text deltas and tool progress
    signal: CancelSignal
    flush: Callable[[], Awaitable[None]]  # a commit point
    log: logging.LoggerAdapter[logging.Logger]


class ToolCalls:
    """Settling tool calls, and the journal helpers the loop shares with it."""

    wake: AgentWake
    tools: dict[str, AgentTool]
    # Set for typed agents (resolution.py): sees the errors the loop produces itself.
    after_tool_result: Callable[[str, str, str], ToolResult | None] | None
    _tool_slots: asyncio.Semaphore
    _commit_lock: asyncio.Lock

    @property
    def _system(self) -> SystemState:
        return self.wake.activation.state.system

    async def _journal(self, event: Any) -> None:
        """Record a journal event and commit it (one commit point per journaled step)."""
        self.wake.activation.record(event)
        async with self._commit_lock:
            await self.wake.flush()

    def caller(self) -> tuple[dict[str, str] | None, Any]:
        """``(identity, client_data)`` of the messages the open run took, latest first."""
        identity, client_data = None, None
        run = self.wake.activation.current_run
        for event in reversed(self._system.history):
            if isinstance(event, UserTurn) and event.run_id == run:
                identity = identity or event.identity
                client_data = client_data if client_data is not None else event.client_data
        return identity, client_data

    def _check_lease(self) -> None:
        """Right before a model request or a tool's execute: stop if the wake's lease
        lapsed (by its local deadline, so also right after the process was paused),
        before anything is paid for or done. Nothing is committed; the next owner
        resumes the run from its journal."""
        signal = self.wake.signal
        if signal.lease_lapsed():
            raise WakeInterrupted(signal.reason or "the lease lapsed")

    async def _race(self, work: Awaitable[Any]) -> Any:
        """Await ``work`` unless the signal fires first (then cancel it and stop)."""
        finished, result = await first_of(work, self.wake.signal.wait())
        if not finished:
            raise StopRun
        return result

    async def _run_tools(self, run_id: str, step: AssistantStep, history: list[Any]) -> None:
        """Settle every call of ``step``: run it, or give the model an error result."""
        outcomes = {e.tool_call_id for e in history if isinstance(e, ToolOutcome)}
        intents = {c.id for e in history if isinstance(e, ToolIntent) for c in e.calls}
        to_run: list[Call] = []
        system = self._system
        waiting = False
        for call in tool_uses(step.content):
            call_id = call["id"]
            if call_id in outcomes:
                continue
            answer = system.settled.get(call_id)
            if answer is not None:
                approved = await self._take_answer(run_id, call, answer)
                if approved is not None:
                    to_run.append(approved)
            elif call_id in system.actions:
                waiting = True  # its pending tool action is not answered yet
            else:
                admitted = await self._admit(run_id, call, step, in_doubt=call_id in intents)
                if admitted == "wait":
                    waiting = True
                elif admitted is not None:
                    to_run.append(admitted)
        if to_run:
            await self._start(run_id, to_run, intents)
        if waiting:
            raise SuspendRun

    async def _admit(
        self, run_id: str, call: dict[str, Any], step: AssistantStep, *, in_doubt: bool
    ) -> Call | Literal["wait"] | None:
        """A call not settled yet: return it to run, make it wait for a pending tool action
        (``"wait"``), or refuse it with an error result (``None``)."""
        call_id, name = call["id"], call["name"]
        if step.stop_reason == "max_tokens":  # the call's input may be cut off: never run it
            await self._refuse(
                run_id,
                call_id,
                name,
                "The response hit max_tokens before this call was complete, so it was not run.",
            )
            return None
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            await self._refuse(
                run_id, call_id, name, f"Unknown tool {name!r}. Available tools: {known}."
            )
            return None
        if in_doubt and not tool.rerun_when_in_doubt:
            await self._refuse(
                run_id,
                call_id,
                name,
                "This call was interrupted (the worker stopped while it ran) and the tool "
                "must not be run twice, so it was not retried. Its effect is unknown.",
            )
            return None
        if not await tool.is_enabled():
            await self._refuse(
                run_id, call_id, name, f"The tool {name!r} is disabled and cannot run now."
            )
            return None
        try:
            params = tool.parse(call.get("input"))
        except ValueError as exc:
            await self._refuse(run_id, call_id, name, f"Invalid arguments for {name}: {exc}")
            return None
        if tool.client_routed or await tool.wants_approval(call_id, params):
            await self._request_action(run_id, call, tool)
            return "wait"
        return (call, tool, params)

    async def _request_action(self, run_id: str, call: dict[str, Any], tool: AgentTool) -> None:
        """The call waits for a client's output or a person's decision."""
        now_ms = int(time.time() * 1000)
        expires_ms = int(now_ms + tool.action_ttl * 1000) if tool.action_ttl else 0
        request = ActionRequested(
            run_id=run_id,
            tool_call_id=call["id"],
            tool=tool.name,
            kind="client" if tool.client_routed else "approval",
            input=call.get("input"),
            input_schema=tool.input_schema(),
            output_schema=tool.output_schema,
            authorized=self.caller()[0],
            created_ms=now_ms,
            expires_ms=expires_ms,
        )
        act = self.wake.activation
        if expires_ms:
            act.add_effect(
                Effect(
                    kind="expire",
                    target=self.wake.entity_url,
                    key=act.next_key(),
                    payload=call["id"],
                    due_ms=expires_ms,
                )
            )
        await self._journal(request)

    async def _take_answer(
        self, run_id: str, call: dict[str, Any], answer: ActionSettled
    ) -> Call | None:
        """Turn the answer to a pending action into the call's result; for an approval,
        return the call to run (with the edited input, validated again)."""
        call_id, name = call["id"], call["name"]
        tool = self.tools.get(name)
        who = f" by {answer.by}" if answer.by else ""
        if answer.decision in ("failed", "cancelled", "expired", "denied"):
            reason = answer.error or "no reason given"
            await self._refuse(
                run_id, call_id, name, f"The call was {answer.decision}{who}: {reason}"
            )
            return None
        if tool is None or not await tool.is_enabled():
            await self._refuse(
                run_id,
                call_id,
                name,
                f"The tool {name!r} is disabled; the {answer.decision} was rejected.",
            )
            return None
        if answer.decision == "output":
            if tool.accept_output is not None:
                result = await tool.accept_output(call_id, call.get("input"), answer.output)
            else:
                stored = answer.output
                result = ToolResult(json.dumps(stored, ensure_ascii=False), {"output": stored})
            await self._outcome(
                run_id, call_id, name, result.content, result.is_error, result.details
            )
            return None
        edited = answer.edited_input if answer.edited_input is not None else call.get("input")
        try:
            params = tool.parse(edited)
        except ValueError as exc:
            await self._refuse(run_id, call_id, name, f"Invalid arguments for {name}: {exc}")
            return None
        return ({**call, "input": edited}, tool, params)

    async def _start(self, run_id: str, to_run: list[Call], intents: set[str]) -> None:
        """Journal the intents of ``to_run`` (one commit), then run them concurrently."""
        new_intents = [
            ToolCall(id=c["id"], name=c["name"], input=c.get("input"))
            for c, _, _ in to_run
            if c["id"] not in intents
        ]
        if new_intents:
            await self._journal(ToolIntent(run_id=run_id, calls=new_intents))
        await self._race(all_of([self._execute(run_id, c, t, p) for c, t, p in to_run]))

    @tracing.tool_call
    @metrics.tool_call
    async def _execute(
        self, run_id: str, call: dict[str, Any], tool: AgentTool, params: Any
    ) -> None:
        call_id = call["id"]
        live = self.wake.live

        def on_update(update: Any) -> None:
            live.tool_update(call_id, tool.name, update)

        # Everything this call buffers (writes, effects, its result) is committed together,
        # apart from the other calls running now (see scope.py).
        scope = CURRENT_TOOL_CALL.set(call_id)
        try:
            async with self._tool_slots:
                self._check_lease()
                try:
                    result = await tool.execute(call_id, params, self.wake.signal, on_update)
                except ToolBugError as bug:
                    await self._outcome(
                        run_id, call_id, tool.name, bug.public, True, {"traceback": bug.detail}
                    )
                    raise
                # A failing tool is reported to the model, not a failed run. (CancelledError
                # and WakeInterrupted are BaseExceptions: they pass.)
                except Exception as exc:
                    self.wake.log.warning("tool %s (%s) raised: %r", tool.name, call_id, exc)
                    result = ToolResult(
                        f"The tool raised {type(exc).__name__}: {exc}", is_error=True
                    )
            if not isinstance(result, ToolResult):
                result = ToolResult(result)
            tracing.tool_result(result.is_error)
            metrics.tool_result(tool.name, result.is_error)
            await live.drain()
            await self._outcome(
                run_id, call_id, tool.name, result.content, result.is_error, result.details
            )
        finally:
            CURRENT_TOOL_CALL.reset(scope)

    async def _refuse(self, run_id: str, call_id: str, name: str, message: str) -> None:
        """A call the loop itself cannot run (unknown or disabled tool, bad arguments,
        interrupted, cut off): an error result, unless ``after_tool_result`` turns it
        into an output."""
        result = self.after_tool_result(name, call_id, message) if self.after_tool_result else None
        if result is None:
            await self._outcome(run_id, call_id, name, message, True)
        else:
            await self._outcome(
                run_id, call_id, name, result.content, result.is_error, result.details
            )

    async def _outcome(
        self,
        run_id: str,
        call_id: str,
        name: str,
        content: Content,
        is_error: bool,
        details: Any = None,
    ) -> None:
        await self._journal(
            ToolOutcome(
                run_id=run_id,
                tool_call_id=call_id,
                name=name,
                content=content_blocks(content),
                is_error=is_error,
                details=msgspec.to_builtins(details) if details is not None else None,
            )
        )
