"""The agent loop: ``ctx.use_agent(...)`` and ``await ctx.agent.run()``.

A run alternates model steps and tool calls until the model ends its turn.
Everything is journaled in the entity log and committed as it happens:

1. new inputs of the wake (messages, children's results, ...) become a
   ``user_turn``;
2. each model response is an ``assistant_step``, committed before any of its
   tool calls runs;
3. the step's tool calls get a ``tool_intent`` (committed) before ``execute``
   and a ``tool_result`` (committed) after.

If the worker dies, the next one replays the handler and ``run()`` resumes from
the journal: journaled steps are not sent to the model again, settled calls
are not executed again, and a call with an intent but no result is *in doubt*:
it is run again with the same ``tool_call_id`` (its idempotency key) unless the
tool says it must not be (``rerun_when_in_doubt=False``), in which case the model
gets an error result saying the call was interrupted.

The loop does not see the handler context: ``ctx.use_agent`` hands it an
:class:`AgentWake` with what it needs of the wake (the inputs, the activation it
journals into, the live stream, the signal, the commit point), so the agent layer
sits below the context and never imports it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .activation import Activation
from .agent_tools import AgentTool, Content, OnUpdate, ToolResult, content_blocks, struct_schema
from .cancellation import CancelSignal
from .errors import ModelError, ToolBugError, WakeInterrupted
from .events import (
    ActionRequested,
    ActionSettled,
    AssistantStep,
    Effect,
    LogRecord,
    Message,
    ToolCall,
    ToolIntent,
    ToolOutcome,
    UserTurn,
)
from .history import project, render_input, tool_uses
from .live import LivePublisher
from .models import Model, ModelRequest, ModelResponse, Usage, resolve_model
from .scope import CURRENT_TOOL_CALL
from .state import SystemState

__all__ = [  # ToolBugError and WakeInterrupted live in errors.py; re-exported for old imports
    "Agent",
    "AgentTool",
    "AgentWake",
    "Content",
    "OnUpdate",
    "RunResult",
    "ToolBugError",
    "ToolResult",
    "WakeInterrupted",
    "render_input",
    "struct_schema",
]


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


@dataclass
class RunResult:
    run_id: str | None
    status: Literal["completed", "failed", "cancelled", "idle", "suspended"]
    response: str | None = None
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    steps: int = 0
    tool_calls: int = 0
    stop_reason: str | None = None


class _Suspended(Exception):
    """Calls of the step wait for pending actions: the run suspends (stays open)."""


class _Stopped(Exception):
    """The signal fired while the run was waiting."""


class Agent:
    """The agent of one wake. Create it with ``ctx.use_agent``; call ``run()``."""

    def __init__(
        self,
        wake: AgentWake,
        *,
        system_prompt: str,
        model: str | Model,
        tools: list[AgentTool] | None = None,
        max_steps: int = 25,
        max_run_tokens: int | None = None,
        max_output_tokens: int = 4096,
        tool_concurrency: int = 8,
    ) -> None:
        self.wake = wake
        self.system_prompt = system_prompt
        self.model = resolve_model(model)
        self.tools: dict[str, AgentTool] = {}
        for tool in tools or []:
            self.add_tool(tool)
        self.max_steps = max_steps
        self.max_run_tokens = max_run_tokens
        self.max_output_tokens = max_output_tokens
        self._tool_slots = asyncio.Semaphore(tool_concurrency)
        # Set for typed agents (contracts.py): sees the errors the loop produces itself.
        self.after_tool_result: Callable[[str, str, str], ToolResult | None] | None = None
        self._commit_lock = asyncio.Lock()

    # -- journal helpers -----------------------------------------------------------

    @property
    def _system(self) -> SystemState:
        return self.wake.activation.state.system

    def _run_history(self, run_id: str) -> list[Any]:
        return [e for e in self._system.history if e.run_id == run_id]

    async def _journal(self, event: Any) -> None:
        """Record a journal event and commit it (one commit point per journaled step)."""
        self.wake.activation.record(event)
        async with self._commit_lock:
            await self.wake.flush()

    def add_tool(self, tool: AgentTool) -> None:
        if tool.name in self.tools:
            raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
        self.tools[tool.name] = tool

    def _offer_client_tools(self, run_id: str) -> str | None:
        """Add the tools the run's client offered (the latest snapshot of its messages);
        return an error if one collides with a backend tool."""
        snapshot = next(
            (
                e.client_tools
                for e in reversed(self._system.history)
                if isinstance(e, UserTurn) and e.run_id == run_id and e.client_tools
            ),
            None,
        )
        for spec in snapshot or []:
            existing = self.tools.get(spec["name"])
            if existing is not None and not existing.label.startswith("client:"):
                return f"the client tool {spec['name']!r} collides with a backend tool of that name"
            self.tools[spec["name"]] = AgentTool(
                name=spec["name"],
                description=spec.get("description", ""),
                parameters=spec["input_schema"],
                execute=_client_side,
                label=f"client:{spec['name']}",
                client_routed=True,
                output_schema=spec.get("output_schema"),
            )
        return None

    def caller(self) -> tuple[dict[str, str] | None, Any]:
        """``(identity, client_data)`` of the messages the open run took, latest first."""
        identity, client_data = None, None
        run = self.wake.activation.current_run
        for event in reversed(self._system.history):
            if isinstance(event, UserTurn) and event.run_id == run:
                identity = identity or event.identity
                client_data = client_data if client_data is not None else event.client_data
        return identity, client_data

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> RunResult:
        run_id = await self._take_inputs()
        if run_id is None:
            return RunResult(run_id=None, status="idle")
        clash = self._offer_client_tools(run_id)
        if clash is not None:
            return await self._finish(run_id, "failed", error=clash)
        try:
            return await self._loop(run_id)
        except _Suspended:
            steps, usage = self._progress(run_id)
            return RunResult(run_id=run_id, status="suspended", usage=usage, steps=len(steps))
        except _Stopped:
            return await self._stopped(run_id)
        except ToolBugError as bug:
            return await self._finish(run_id, "failed", error=bug.public)

    async def _take_inputs(self) -> str | None:
        """Journal the wake's new inputs as a user turn; return the open run, if any."""
        act = self.wake.activation
        taken = {s for e in self._system.history if isinstance(e, UserTurn) for s in e.sources}
        fresh = [r for r in self.wake.inputs if r.id not in taken and render_input(r)]
        if fresh:
            run_id = act.record_run()
            content = [block for record in fresh for block in render_input(record)]
            messages = [r.event for r in fresh if isinstance(r.event, Message)]
            await self._journal(
                UserTurn(
                    run_id=run_id,
                    content=content,
                    sources=[r.id for r in fresh],
                    identity=next((m.identity for m in reversed(messages) if m.identity), None),
                    client_data=next(
                        (m.client_data for m in reversed(messages) if m.client_data is not None),
                        None,
                    ),
                    client_tools=next(
                        (m.client_tools for m in reversed(messages) if m.client_tools), None
                    ),
                )
            )
        return act.current_run

    async def _loop(self, run_id: str) -> RunResult:
        while True:
            self._check_signal()
            history = self._run_history(run_id)
            steps, usage = self._progress(run_id)
            last = steps[-1] if steps else None
            if last is not None and not self._settled(last, run_id):
                await self._run_tools(run_id, last, history)
                continue
            if isinstance(history[-1], AssistantStep) and not tool_uses(history[-1].content):
                return await self._finish(run_id, "completed")
            if len(steps) >= self.max_steps:
                return await self._finish(
                    run_id,
                    "failed",
                    error=f"the run reached its limit of {self.max_steps} model steps",
                )
            if self.max_run_tokens is not None and usage.total_tokens >= self.max_run_tokens:
                return await self._finish(
                    run_id,
                    "failed",
                    error=f"the run used {usage.total_tokens} tokens, over its limit of "
                    f"{self.max_run_tokens}",
                )
            try:
                response = await self._step(run_id, len(steps) + 1)
            except _RunFailed as exc:
                return await self._finish(run_id, "failed", error=str(exc))
            await self._journal(
                AssistantStep(
                    run_id=run_id,
                    step=len(steps) + 1,
                    content=response.content,
                    stop_reason=response.stop_reason,
                    usage=msgspec.structs.asdict(response.usage),
                    model=response.model or self.model.name,
                )
            )

    def _settled(self, step: AssistantStep, run_id: str) -> bool:
        done = {e.tool_call_id for e in self._run_history(run_id) if isinstance(e, ToolOutcome)}
        return all(b["id"] in done for b in tool_uses(step.content))

    async def _step(self, run_id: str, step: int) -> ModelResponse:
        request = ModelRequest(
            model=self.model.name,
            system=self.system_prompt,
            messages=project(self._system.history),
            tools=[tool.spec() for tool in self.tools.values() if await tool.is_enabled()],
            max_tokens=self.max_output_tokens,
        )
        live = self.wake.live

        def on_text(delta: str) -> None:
            live.text(delta, run_id=run_id, step=step)

        try:
            return await self._race(self.model.complete(request, on_text=on_text))
        except ModelError as exc:
            if exc.retryable:
                raise  # the wake is retried with backoff and resumes from the journal
            raise _RunFailed(str(exc)) from exc
        finally:
            await live.drain()

    async def _run_tools(self, run_id: str, step: AssistantStep, history: list[Any]) -> None:
        """Settle every call of ``step``: run it, or give the model an error result."""
        outcomes = {e.tool_call_id for e in history if isinstance(e, ToolOutcome)}
        intents = {c.id for e in history if isinstance(e, ToolIntent) for c in e.calls}
        to_run: list[tuple[dict[str, Any], AgentTool, Any]] = []
        system = self._system
        waiting = False
        for call in tool_uses(step.content):
            call_id, name = call["id"], call["name"]
            if call_id in outcomes:
                continue
            answer = system.settled.get(call_id)
            if answer is not None:
                approved = await self._take_answer(run_id, call, answer)
                if approved is not None:
                    to_run.append(approved)
                continue
            if call_id in system.actions:
                waiting = True
                continue
            if step.stop_reason == "max_tokens":  # the call's input may be cut off: never run it
                await self._refuse(
                    run_id,
                    call_id,
                    name,
                    "The response hit max_tokens before this call was complete, so it was not run.",
                )
                continue
            tool = self.tools.get(name)
            if tool is None:
                known = ", ".join(sorted(self.tools)) or "none"
                await self._refuse(
                    run_id, call_id, name, f"Unknown tool {name!r}. Available tools: {known}."
                )
                continue
            if call_id in intents and not tool.rerun_when_in_doubt:
                await self._refuse(
                    run_id,
                    call_id,
                    name,
                    "This call was interrupted (the worker stopped while it ran) and the tool "
                    "must not be run twice, so it was not retried. Its effect is unknown.",
                )
                continue
            if not await tool.is_enabled():
                await self._refuse(
                    run_id,
                    call_id,
                    name,
                    f"The tool {name!r} is disabled and cannot run now.",
                )
                continue
            try:
                params = tool.parse(call.get("input"))
            except ValueError as exc:
                await self._refuse(run_id, call_id, name, f"Invalid arguments for {name}: {exc}")
                continue
            if tool.client_routed or await tool.wants_approval(call_id, params):
                await self._request_action(run_id, call, tool)
                waiting = True
                continue
            to_run.append((call, tool, params))
        if to_run:
            await self._start(run_id, to_run, intents)
        if waiting:
            raise _Suspended

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
    ) -> tuple[dict[str, Any], AgentTool, Any] | None:
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

    async def _start(
        self, run_id: str, to_run: list[tuple[dict[str, Any], AgentTool, Any]], intents: set[str]
    ) -> None:
        """Journal the intents of ``to_run`` (one commit), then run them concurrently."""
        new_intents = [
            ToolCall(id=c["id"], name=c["name"], input=c.get("input"))
            for c, _, _ in to_run
            if c["id"] not in intents
        ]
        if new_intents:
            await self._journal(ToolIntent(run_id=run_id, calls=new_intents))
        await self._race(asyncio.gather(*(self._execute(run_id, c, t, p) for c, t, p in to_run)))

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
                try:
                    result = await tool.execute(call_id, params, self.wake.signal, on_update)
                except ToolBugError as bug:
                    await self._outcome(
                        run_id, call_id, tool.name, bug.public, True, {"traceback": bug.detail}
                    )
                    raise
                except (
                    Exception
                ) as exc:  # a failing tool is reported to the model, not a failed run
                    # (CancelledError and WakeInterrupted are BaseExceptions: they pass.)
                    self.wake.log.warning("tool %s (%s) raised: %r", tool.name, call_id, exc)
                    result = ToolResult(
                        f"The tool raised {type(exc).__name__}: {exc}", is_error=True
                    )
            if not isinstance(result, ToolResult):
                result = ToolResult(result)
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

    # -- ending a run --------------------------------------------------------------

    def _progress(self, run_id: str) -> tuple[list[AssistantStep], Usage]:
        """The run's model steps so far and their summed usage."""
        steps = [e for e in self._run_history(run_id) if isinstance(e, AssistantStep)]
        return steps, sum((Usage(**s.usage) for s in steps), Usage())

    async def _finish(
        self,
        run_id: str,
        status: Literal["completed", "failed", "cancelled"],
        *,
        error: str | None = None,
    ) -> RunResult:
        journaled, usage = self._progress(run_id)
        last = journaled[-1] if journaled else None
        steps = len(journaled)
        response = None
        if last is not None:
            response = "".join(b.get("text", "") for b in last.content if b.get("type") == "text")
        calls = sum(len(tool_uses(s.content)) for s in journaled)
        self.wake.activation.finish_run(
            status,
            response=response if status == "completed" else None,
            error=error,
            usage=msgspec.structs.asdict(usage),
            steps=steps,
            tool_calls=calls,
        )
        async with self._commit_lock:
            await self.wake.flush()
        return RunResult(
            run_id=run_id,
            status=status,
            response=response if status == "completed" else None,
            error=error,
            usage=usage,
            steps=steps,
            tool_calls=calls,
            stop_reason=last.stop_reason if last is not None else None,
        )

    async def _stopped(self, run_id: str) -> RunResult:
        signal = self.wake.signal
        if signal.kind != "cancel":
            raise WakeInterrupted(signal.reason or "interrupted")
        return await self._finish(run_id, "cancelled", error=signal.reason or "cancelled")

    def _check_signal(self) -> None:
        if self.wake.signal.cancelled:
            raise _Stopped

    async def _race(self, work: Awaitable[Any]) -> Any:
        """Await ``work`` unless the signal fires first (then cancel it and stop)."""
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(self.wake.signal.wait())
        try:
            done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _Stopped


async def _client_side(*_: Any) -> ToolResult:  # pragma: no cover - never called
    raise AssertionError("a client tool runs in the client")


class _RunFailed(Exception):
    pass
