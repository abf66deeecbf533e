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
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from . import metrics, tracing
from .activation import Activation
from .agent_tools import AgentTool, Content, RuntimeErrorInfo, ToolResult
from .blocks import model_blocks
from .cancellation import CancelSignal
from .errors import InvalidBlockError, ToolBugError, WakeInterrupted, describe
from .events import (
    ActionRequested,
    ActionSettled,
    AssistantStep,
    Effect,
    LogRecord,
    RuntimeErrorRecorded,
    ToolCall,
    ToolIntent,
    ToolOutcome,
    UserTurn,
)
from .history import tool_uses
from .live import LivePublisher
from .scope import CURRENT_TOOL_CALL
from .state import SystemState
from .stop_reasons import TRUNCATED
from .tasks import all_of

_DETAIL_LIMIT = 64 * 1024  # characters of a bug's full error kept in its runtime_error event

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
    # Set for typed agents (resolution.py): sees the errors the loop produces itself,
    # given ``(name, tool_call_id, message, the call's input)``.
    after_tool_result: Callable[[str, str, str, Any], Awaitable[ToolResult | None]] | None
    # Set for typed agents: the agent's name, recorded with each pending action.
    agent_name: str | None
    # Set for typed agents (define_agent's on_runtime_error): told of every bug in full.
    on_runtime_error: Callable[[RuntimeErrorInfo], Any] | None
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
        """``(identity, client_data)`` of the open run: the identity it belongs to
        (``RunStarted.identity``; for a run journaled before runs recorded one, that
        of its first message), and the client data of its latest message."""
        identity, client_data = self._system.run_identity, None
        run = self.wake.activation.current_run
        first: dict[str, str] | None = None
        for event in reversed(self._system.history):
            if isinstance(event, UserTurn) and event.run_id == run:
                first = event.identity
                client_data = client_data if client_data is not None else event.client_data
        return identity if identity is not None else first, client_data

    def _check_lease(self) -> None:
        """Right before a model request or a tool's execute: stop if the wake's lease
        lapsed (by its local deadline, so also right after the process was paused),
        before anything is paid for or done. Nothing is committed; the next owner
        resumes the run from its journal."""
        signal = self.wake.signal
        if signal.lease_lapsed():
            raise WakeInterrupted(signal.reason or "the lease lapsed")

    async def _race(self, work: Awaitable[Any]) -> Any:
        """Await ``work`` unless the signal fires first (then cancel it and stop).

        The work runs in a task of its own, which the signal cancels when it fires (a
        callback: a race costs one task, not a second one waiting on the signal). The
        cancel comes after the wake-ups the signal caused, so a tool waiting on the
        signal sees it first. The work is awaited to its end either way; once stopped,
        whatever it then did (a late result or failure) gives way to the stop."""
        task = asyncio.ensure_future(work)
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.get_loop().call_soon(task.cancel)

        remove = self.wake.signal.on_cancel(stop)
        try:
            result = await task
        except BaseException:
            current = asyncio.current_task()
            if stopped and (current is None or not current.cancelling()):
                raise StopRun from None
            raise  # a failure of the work, or this wake itself was cancelled
        finally:
            remove()
        if stopped:
            raise StopRun
        return result

    async def _run_tools(self, run_id: str, step: AssistantStep, history: list[Any]) -> None:
        """Settle every call of ``step``: run it, or give the model an error result."""
        outcomes = {e.tool_call_id for e in history if isinstance(e, ToolOutcome)}
        intents = {c.id: c for e in history if isinstance(e, ToolIntent) for c in e.calls}
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
                if approved == "wait":
                    waiting = True  # the answer was refused: the action is pending again
                elif approved is not None:
                    to_run.append(approved)
            elif call_id in system.actions:
                waiting = True  # its pending tool action is not answered yet
            else:
                admitted = await self._admit(run_id, call, step, intents.get(call_id))
                if admitted == "wait":
                    waiting = True
                elif admitted is not None:
                    to_run.append(admitted)
        if to_run:
            await self._start(run_id, to_run, intents)
        if waiting:
            raise SuspendRun

    def tool_named(self, name: str) -> AgentTool | None:
        """The tool a call names: by its name, or by a name it had before (the calls
        journaled before a rename), unless another tool now has that name."""
        tool = self.tools.get(name)
        if tool is None:
            tool = next((t for t in self.tools.values() if name in t.former_names), None)
        return tool

    async def _admit(
        self, run_id: str, call: dict[str, Any], step: AssistantStep, intent: ToolCall | None
    ) -> Call | Literal["wait"] | None:
        """A call not settled yet: return it to run, make it wait for a pending tool action
        (``"wait"``), or refuse it with an error result (``None``). With an ``intent`` the
        call is in doubt: it started and its result was never committed."""
        call_id, name = call["id"], call["name"]
        if step.stop_reason in TRUNCATED:  # the call's input may be cut off: never run it
            await self._refuse(
                run_id,
                call,
                f"The response hit {step.stop_reason} before this call was complete, so it "
                "was not run.",
            )
            return None
        tool = self.tool_named(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            await self._refuse(run_id, call, f"Unknown tool {name!r}. Available tools: {known}.")
            return None
        if intent is not None:
            changed = contract_change(name, intent.tool_id, tool)
            if changed is not None:
                await self._refuse(run_id, call, changed, tool.id)
                return None
            if not tool.rerun_when_in_doubt:
                await self._refuse(
                    run_id,
                    call,
                    "This call was interrupted (the worker stopped while it ran) and the "
                    "tool is not run again when in doubt, so it was not retried. Its effect "
                    "is unknown.",
                    tool.id,
                )
                return None
        if not await tool.is_enabled():
            await self._refuse(run_id, call, f"The tool {name!r} is disabled and cannot run now.")
            return None
        try:
            params = tool.parse(call.get("input"))
        except ValueError as exc:
            await self._refuse(run_id, call, f"Invalid arguments for {name}: {exc}")
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
            tool=call["name"],
            kind="client" if tool.client_routed else "approval",
            tool_id=tool.id,
            input=call.get("input"),
            input_schema=tool.input_schema(),
            output_schema=tool.output_schema,
            authorized=self.caller()[0],
            created_ms=now_ms,
            expires_ms=expires_ms,
            agent=self.agent_name,
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
    ) -> Call | Literal["wait"] | None:
        """Turn the answer to a pending action into the call's result; for an approval,
        return the call to run (with the edited input, validated again). An output or
        an approval for a tool that is disabled now is refused: the action is requested
        again (``"wait"``), as the client that checks before answering refuses it."""
        call_id, name = call["id"], call["name"]
        tool = self.tool_named(name)
        who = f" by {answer.by}" if answer.by else ""
        if answer.decision in ("failed", "cancelled", "expired", "denied"):
            reason = answer.error or "no reason given"
            await self._refuse(run_id, call, f"The call was {answer.decision}{who}: {reason}")
            return None
        if answer.decision == "skipped":  # like a cancel, whether or not the tool is enabled
            reason = answer.error or "skipped"
            synthetic = {"skipped": True, "reason": reason}
            if tool is not None and tool.observe_skip is not None:
                await tool.observe_skip(call_id, call.get("input"), synthetic)
            await self._outcome(
                run_id,
                call_id,
                name,
                f"The call was skipped{who}, so it was not run: {reason}. "
                f"Its synthetic output: {json.dumps(synthetic, ensure_ascii=False)}",
                False,
                {"output": synthetic, "skipped": True},
            )
            return None
        request = self._system.answered.get(call_id)
        changed = contract_change(name, request.tool_id, tool) if request and tool else None
        if changed is not None:  # an output or an approval for another contract
            what = "submitted output" if answer.decision == "output" else "approval"
            await self._refuse(run_id, call, f"The {what} was rejected. {changed}")
            return None
        enabled = tool is not None and await tool.is_enabled()
        why = f"the tool {name!r} is disabled now"
        if tool is not None and not enabled and await self._reopen(answer, why):
            return "wait"
        if tool is None or not enabled:  # no registration, or no request to reopen
            await self._refuse(
                run_id,
                call,
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
                run_id, call_id, name, result.content, result.is_error, result.details, tool.id
            )
            return None
        edited = answer.edited_input if answer.edited_input is not None else call.get("input")
        try:
            params = tool.parse(edited)
        except ValueError as exc:
            await self._refuse(run_id, call, f"Invalid arguments for {name}: {exc}")
            return None
        return ({**call, "input": edited}, tool, params)

    async def _reopen(self, answer: ActionSettled, why: str) -> bool:
        """Refuse an answer the run cannot take: the call's action is pending again (the
        same request, with why the answer was refused), and the run suspends. False if
        the request is not known (state folded by a version that did not keep it)."""
        request = self._system.answered.get(answer.tool_call_id)
        if request is None:
            return False
        await self._journal(
            msgspec.structs.replace(request, refused=f"the {answer.decision} was refused: {why}")
        )
        return True

    async def _start(
        self, run_id: str, to_run: list[Call], intents: Mapping[str, ToolCall]
    ) -> None:
        """Journal the intents of ``to_run`` (one commit), then run them concurrently."""
        new_intents = [
            ToolCall(id=c["id"], name=c["name"], input=c.get("input"), tool_id=t.id)
            for c, t, _ in to_run
            if c["id"] not in intents
        ]
        if new_intents:
            await self._journal(ToolIntent(run_id=run_id, calls=new_intents))

        async def run_all() -> None:
            # The calls' coroutines are made inside the race's task: a task cancelled
            # before its first step (the worker killed) leaves none of them unawaited.
            await all_of([self._execute(run_id, c, t, p) for c, t, p in to_run])

        await self._race(run_all())

    @tracing.tool_call
    @metrics.tool_call
    async def _execute(
        self, run_id: str, call: dict[str, Any], tool: AgentTool, params: Any
    ) -> None:
        call_id, name = call["id"], call["name"]
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
                except ToolBugError as bug:  # the run fails (Agent.run reports the bug)
                    await self._outcome(
                        run_id, call_id, tool.name, bug.public, True, {"error": bug.public}, tool.id
                    )
                    raise
                # A failing tool is reported to the model, not a failed run. (CancelledError
                # and WakeInterrupted are BaseExceptions: they pass.)
                except Exception as exc:
                    self.wake.log.warning(
                        "tool %s (%s) raised: %s", tool.name, call_id, describe(exc)
                    )
                    result = ToolResult(f"The tool raised {describe(exc)}", is_error=True)
            if not isinstance(result, ToolResult):
                result = ToolResult(result)
            tracing.tool_result(result.is_error)
            metrics.tool_result(tool.name, result.is_error)
            await live.drain()
            await self._outcome(
                run_id, call_id, name, result.content, result.is_error, result.details, tool.id
            )
        finally:
            CURRENT_TOOL_CALL.reset(scope)

    async def _report_bug(self, run_id: str, bug: ToolBugError) -> None:
        """A bug fails the run: its full error goes to operators only (the worker log,
        the ``on_runtime_error`` hook, and a ``runtime_error`` event the gateway never
        sends, committed with the run's end); clients see ``bug.public``."""
        self.wake.log.error(
            "run %s failed on a bug in tool %s (call %s): %s\n%s",
            run_id,
            bug.tool or "?",
            bug.tool_call_id or "?",
            bug.public,
            bug.detail,
        )
        self.wake.activation.record(
            RuntimeErrorRecorded(
                run_id=run_id,
                error=bug.public,
                detail=bug.detail[-_DETAIL_LIMIT:],
                tool_call_id=bug.tool_call_id,
                tool=bug.tool,
                at_ms=int(time.time() * 1000),
            )
        )
        hook = self.on_runtime_error
        if hook is None:
            return
        info = RuntimeErrorInfo(
            entity_url=self.wake.entity_url,
            run_id=run_id,
            tool=bug.tool,
            tool_call_id=bug.tool_call_id,
            error=bug.public,
            detail=bug.detail,
            exception=bug.__cause__ or bug,
        )
        try:
            reported = hook(info)
            if inspect.isawaitable(reported):
                await reported
        except Exception:  # the run fails either way; a broken hook must not hide why
            self.wake.log.exception("on_runtime_error raised while reporting run %s", run_id)

    async def _refuse(
        self, run_id: str, call: dict[str, Any], message: str, tool_id: str | None = None
    ) -> None:
        """A call the loop itself cannot run (unknown or disabled tool, bad arguments,
        interrupted, cut off): an error result, unless ``after_tool_result`` turns it
        into an output (which the registration's ``on_output`` sees with the input)."""
        call_id, name = call["id"], call["name"]
        hook = self.after_tool_result
        result = await hook(name, call_id, message, call.get("input")) if hook else None
        if result is None:
            await self._outcome(run_id, call_id, name, message, True, tool_id=tool_id)
        else:
            await self._outcome(
                run_id, call_id, name, result.content, result.is_error, result.details, tool_id
            )

    async def _outcome(
        self,
        run_id: str,
        call_id: str,
        name: str,
        content: Content,
        is_error: bool,
        details: Any = None,
        tool_id: str | None = None,
    ) -> None:
        """Journal a call's result. Content the Messages API would refuse is a bug of the
        tool: the model gets an error result instead, and the run fails on the bug."""
        try:
            blocks = model_blocks(content)
        except InvalidBlockError as exc:
            public = f"The tool {name!r} returned content the model cannot take: {exc}"
            await self._outcome(run_id, call_id, name, public, True, {"error": public}, tool_id)
            raise ToolBugError(
                public,
                f"{public}\nThe content (first 2000 characters): {repr(content)[:2000]}",
                tool=name,
                tool_call_id=call_id,
            ) from exc
        await self._journal(
            ToolOutcome(
                run_id=run_id,
                tool_call_id=call_id,
                name=name,
                content=blocks,
                is_error=is_error,
                details=msgspec.to_builtins(details) if details is not None else None,
                tool_id=tool_id,
            )
        )


def contract_change(name: str, recorded: str | None, tool: AgentTool) -> str | None:
    """Why a persisted call (recorded with tool id ``recorded``) must not meet ``tool``:
    the name now belongs to another contract. ``None`` when the ids agree, or when the
    call recorded none (a tool without an id, or a log older than ids)."""
    if recorded is None or recorded == tool.id:
        return None
    return (
        f"This call was made to tool {name!r} with id {recorded!r}, but {name!r} is now "
        f"tool {tool.id!r}: it is not run against another contract."
    )
