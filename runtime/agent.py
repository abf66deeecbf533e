"""The agent loop: ``ctx.use_agent(...)`` and ``await ctx.agent.run()``.

A run alternates model steps and tool calls until the model ends its turn.
Everything is journaled in the entity log and committed as it happens:

1. new inputs of the wake (messages, children's results, ...) become a
   ``user_turn``, committed with the run's first commit;
2. each model response is an ``assistant_step``, committed with its tool calls'
   ``tool_intent`` (one commit) before any of them runs;
3. each call's ``tool_result`` is committed after ``execute``;
4. the run's end (with the last step) is committed with the wake's own commit.

So a step costs at most two commits (its step with the intents, and its results);
a crash before the run's first commit takes its inputs again, and a crash after the
model answered but before the step's commit asks the model again for that step.

If the worker dies, the next one replays the handler and ``run()`` resumes from
the journal: journaled steps are not sent to the model again, settled calls
are not executed again, and a call with an intent but no result is *in doubt*:
it is run again with the same ``tool_call_id`` (its idempotency key) if the tool
allows it (``AgentTool.rerun_when_in_doubt``: plain tools do unless created with
``False``; typed tools only with ``rerun_in_doubt=True``), else the model gets an
error result saying the call was interrupted. A call in doubt recorded with
another tool id than the tool now under its name is never run (see agent_calls.py).

The loop does not see the handler context: ``ctx.use_agent`` hands it an
:class:`AgentWake` with what it needs of the wake (the inputs, the activation it
journals into, the live stream, the signal, the commit point), so the agent layer
sits below the context and never imports it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from . import metrics, tracing
from .agent_calls import AgentWake, StopRun, SuspendRun, ToolCalls
from .agent_options import RequestOptions, check_agent_options
from .agent_tools import AgentTool, Content, OnUpdate, ToolResult, struct_schema
from .blocks import check_tool_name
from .compaction import ContextKeeper, Mode
from .context_window import ContextPolicy, is_prompt_too_long
from .errors import (
    ConversationError,
    MissingAPIKeyError,
    ModelError,
    ToolBugError,
    ToolContractError,
    WakeInterrupted,
)
from .events import (
    AssistantStep,
    ConversationCompacted,
    ConversationRequested,
    Effect,
    Message,
    ModelRetryDue,
    RunFailedNote,
    ToolOutcome,
    UserTurn,
)
from .history import render_input, tool_uses
from .model_retry import next_wait, open_wait, wait_is_over
from .models import Model, ModelRequest, ModelResponse, Usage, resolve_model
from .stop_reasons import CONTINUED, REFUSED, run_status, stop_error
from .streamids import id_gt
from .structured_output import FINAL_TOOL, OutputContract

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


RunEnd = Literal["completed", "failed", "cancelled", "truncated", "refused"]


@dataclass
class RunResult:
    """How ``Agent.run`` ended. ``status`` ``truncated`` (the answer was cut off) and
    ``refused`` (the model declined) carry the text the model gave in ``response`` and
    why in ``error``; ``suspended``: the run waits (for a tool action, or out a
    transient model error)."""

    run_id: str | None
    status: Literal["completed", "failed", "cancelled", "truncated", "refused", "idle", "suspended"]
    response: str | None = None
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    steps: int = 0
    tool_calls: int = 0
    stop_reason: str | None = None
    stop_sequence: str | None = None  # the stop sequence the last step matched
    stop_details: dict[str, Any] | None = None  # e.g. a refusal's category, explanation
    # With output_type: the validated answer (an instance of it) and the type's name.
    output: Any = None
    output_type: str | None = None


class Agent(ToolCalls):
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
        context_window: int | None = None,
        context_strategy: str = "compact",
        context_budget: float = 0.8,
        keep_turns: int = 2,
        model_retry_total_s: float = 120.0,
        output_type: type | None = None,
        output_retries: int = 2,
        **request_options: Any,
    ) -> None:
        """``request_options`` are the Messages API options (agent_options.py)."""
        self.wake = wake
        self.system_prompt = system_prompt
        try:
            self.model = resolve_model(model)
        except MissingAPIKeyError as exc:  # each run fails at once, saying so (no retries)
            self.model = _Unavailable(str(model), str(exc))
        self.model_retry_total_s = model_retry_total_s
        self.context = ContextKeeper(
            ContextPolicy.build(
                self.model.name,
                context_window=context_window,
                context_strategy=context_strategy,
                context_budget=context_budget,
                keep_turns=keep_turns,
            ),
            self.model,
            system_prompt=system_prompt,
            max_output_tokens=max_output_tokens,
            cache=wake.activation.state.derived,
        )
        self.tools: dict[str, AgentTool] = {}
        for tool in tools or []:
            self.add_tool(tool)
        check_agent_options(request_options, "Agent")
        self.request_options = RequestOptions.build(request_options)
        self.context.headers = {
            "extra_headers": self.request_options.extra_headers,
            "betas": self.request_options.betas,
        }
        self.output = None if output_type is None else OutputContract(output_type, output_retries)
        if self.output is not None:
            if FINAL_TOOL in self.tools:
                raise ToolContractError(
                    f"a tool is named {FINAL_TOOL!r}, the name of the tool that takes the "
                    "structured answer (output_type); rename it"
                )
            self.add_tool(self.output.tool())
        self.max_steps = max_steps
        self.max_run_tokens = max_run_tokens
        self.max_output_tokens = max_output_tokens
        self._tool_slots = asyncio.Semaphore(tool_concurrency)
        self.after_tool_result = None  # set for typed agents (see ToolCalls)
        self._client_tools: set[str] = set()  # the names of the client's tools, once offered
        self.on_runtime_error = None  # set for typed agents (see ToolCalls)
        self.agent_name = None  # set for typed agents (see ToolCalls)
        self._commit_lock = asyncio.Lock()

    # -- journal helpers -----------------------------------------------------------

    def _run_history(self, run_id: str) -> list[Any]:
        """The journal events of run ``run_id``, in order.

        A run's events are contiguous (one run is open at a time, and what arrives
        while it is open joins it), and the runs asked about are the open one, at the
        end: the scan goes back from the end and stops where the run starts, so it
        costs the run's length, not the conversation's."""
        history = self._system.history
        start = len(history)
        while start > 0:
            event = history[start - 1]
            if isinstance(event, ConversationCompacted) or event.run_id != run_id:
                break
            start -= 1
        return history[start:]

    def add_tool(self, tool: AgentTool) -> None:
        """Add a tool; its name must be new, and a tool of the same id must have the same
        input and output schemas (one id, one contract)."""
        if tool.name in self.tools:
            raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
        check_tool_name(tool.name)
        for other in self.tools.values():
            if tool.id is not None and other.id == tool.id:
                differs = schema_difference(other, tool)
                if differs is not None:
                    raise ToolContractError(
                        f"tool id {tool.id!r} is registered as {other.name!r} and {tool.name!r} "
                        f"with different {differs}s; one id is one contract"
                    )
        self.tools[tool.name] = tool

    def _offer_client_tools(self, run_id: str) -> str | None:
        """Add the tools the run's client offered (the latest snapshot of its messages);
        return an error if one collides with a backend tool."""
        snapshot = next(
            (
                e.client_tools
                for e in reversed(self._run_history(run_id))
                if isinstance(e, UserTurn) and e.client_tools
            ),
            None,
        )
        for spec in snapshot or []:
            name, tool_id = spec["name"], f"client:{spec['name']}"
            if name in self._client_tools:
                continue  # offered by an earlier run() of this wake
            try:
                check_tool_name(name)
            except ToolContractError as exc:
                return f"the client tool {name!r} cannot be offered to the model: {exc}"
            if name in self.tools:
                return f"the client tool {name!r} collides with a backend tool of that name"
            same_id = next((t for t in self.tools.values() if t.id == tool_id), None)
            if same_id is not None:
                return (
                    f"the client tool {name!r} (id {tool_id!r}) collides with the backend "
                    f"tool {same_id.name!r} of that id"
                )
            self.tools[name] = AgentTool(
                name=name,
                description=spec.get("description", ""),
                parameters=spec["input_schema"],
                execute=_client_side,
                label=tool_id,
                client_routed=True,
                output_schema=spec.get("output_schema"),
                id=tool_id,
            )
            self._client_tools.add(name)
        return None

    @tracing.agent_run
    async def run(self) -> RunResult:
        await self._take_conversation_requests()
        run_id = self._take_inputs()
        if run_id is None:
            return RunResult(run_id=None, status="idle")
        clash = self._offer_client_tools(run_id)
        if clash is not None:
            return await self._finish(run_id, "failed", error=clash)
        try:
            return await self._loop(run_id)
        except SuspendRun:
            steps, usage = self._progress(run_id)
            return RunResult(run_id=run_id, status="suspended", usage=usage, steps=len(steps))
        except StopRun:
            return await self._stopped(run_id)
        except ToolBugError as bug:
            await self._report_bug(run_id, bug)
            return await self._finish(run_id, "failed", error=bug.public)

    def _take_inputs(self) -> str | None:
        """Journal the wake's new inputs as a user turn; return the open run, if any."""
        act = self.wake.activation
        fresh = [r for r in self.wake.inputs if render_input(r)]
        if fresh:
            fresh = [r for r in fresh if r.id not in self._taken(fresh[0].id)]
        if fresh:
            run_id = act.record_run()
            content = [block for record in fresh for block in render_input(record)]
            messages = [r.event for r in fresh if isinstance(r.event, Message)]
            # Recorded, not committed: the turn is committed with the run's first commit
            # (its first step's, or the wake's). A crash before it leaves the inputs
            # unhandled, so the next attempt takes them again.
            act.record(
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

    def _taken(self, first: str) -> set[str]:
        """The ids of inputs at or after ``first`` the journal already took.

        Inputs are taken in log order, so the scan goes back from the end only to the
        first user turn that took nothing from ``first`` on. Inputs a compaction
        replaced the turns of count as taken (every id up to its ``taken_upto``)."""
        taken: set[str] = set()
        for event in reversed(self._system.history):
            if isinstance(event, ConversationCompacted):
                if event.taken_upto and not id_gt(first, event.taken_upto):
                    taken.update(
                        r.id for r in self.wake.inputs if not id_gt(r.id, event.taken_upto)
                    )
                break
            if isinstance(event, UserTurn) and event.sources:
                if all(id_gt(first, source) for source in event.sources):
                    break
                taken.update(event.sources)
        return taken

    async def _loop(self, run_id: str) -> RunResult:
        while True:
            self._check_signal()
            history = self._run_history(run_id)
            steps, usage = self._progress(run_id, history)
            last = steps[-1] if steps else None
            if last is not None and not _settled(last, history):
                await self._run_tools(run_id, last, history)
                continue
            decision = self.output.decide(history) if self.output is not None else None
            end = history[-1]
            if decision is not None and decision.kind == "accepted":
                return await self._finish(run_id, "completed", output=decision.output)
            if decision is not None and decision.kind == "exhausted":
                refused = isinstance(end, AssistantStep) and end.stop_reason in REFUSED
                return await self._finish(
                    run_id, "refused" if refused else "failed", error=decision.error
                )
            if decision is not None and decision.kind == "correct" and self.output is not None:
                # The turn ended in text: ask for the answer through the tool. Recorded,
                # not committed: it goes with the next step's commit (a crash before that
                # asks the model again for the step that ended in text).
                self.wake.activation.record(
                    UserTurn(run_id=run_id, content=self.output.nudge(decision.error))
                )
                continue
            if (
                decision is None
                and isinstance(end, AssistantStep)
                and not tool_uses(end.content)
                and end.stop_reason not in CONTINUED  # pause_turn: send it back, go on
            ):
                return await self._finish(run_id, run_status(end.stop_reason))
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
            waiting = open_wait(history)
            if waiting is not None and not wait_is_over(
                waiting, [r.event for r in self.wake.inputs], int(time.time() * 1000)
            ):
                raise SuspendRun  # its timer is pending; a message does not cut it short
            try:
                response = await self._step(run_id, len(steps) + 1)
            except _RunFailed as exc:
                return await self._finish(run_id, "failed", error=str(exc), withdrawn=exc.withdrawn)
            except ModelError as exc:  # transient (the SDK's own retries did not help)
                if not exc.retryable:  # e.g. counting tokens was refused: nothing to wait for
                    return await self._finish(run_id, "failed", error=str(exc))
                gave_up = await self._wait_out(run_id, exc, waiting)
                if gave_up is None:
                    raise SuspendRun from None
                return await self._finish(run_id, "failed", error=gave_up)
            # Recorded, not committed: the step is committed with what comes next (its
            # calls' intents before any runs, its refused calls, a pending action, or the
            # run's end with the wake's commit). A crash before that asks the model again.
            self.wake.activation.record(
                AssistantStep(
                    run_id=run_id,
                    step=len(steps) + 1,
                    content=response.content,
                    stop_reason=response.stop_reason,
                    usage=msgspec.structs.asdict(response.usage),
                    model=response.model or self.model.name,
                    stop_sequence=response.stop_sequence,
                    stop_details=response.stop_details,
                    server_tool_use=response.server_tool_use,
                )
            )

    async def _wait_out(self, run_id: str, exc: ModelError, previous: Any) -> str | None:
        """Journal the wait before the step is made again and its timer (one commit); or,
        if the waits would pass ``model_retry_total_s``, return why the run fails."""
        now_ms = int(time.time() * 1000)
        wait = next_wait(run_id, exc, previous, self.model_retry_total_s, now_ms)
        if wait is None:
            tries = previous.attempt + 1 if previous is not None else 1
            waited = (now_ms - previous.since_ms) / 1000 if previous is not None else 0.0
            return (
                f"{exc} (gave up after {tries} attempts over {waited:.1f}s; "
                f"model_retry_total_s is {self.model_retry_total_s:g})"
            )
        self.wake.log.warning(
            "run %s: model call failed (attempt %d), retrying in %.1fs on a timer: %s",
            run_id,
            wait.attempt,
            (wait.due_ms - now_ms) / 1000,
            exc,
        )
        act = self.wake.activation
        act.add_effect(
            Effect(
                kind="notify",
                target=self.wake.entity_url,
                key=act.next_key(),
                notice=ModelRetryDue(run_id=run_id, attempt=wait.attempt),
                due_ms=wait.due_ms,
            )
        )
        await self._journal(wait)
        return None

    @tracing.model_step
    @metrics.model_step
    async def _step(self, run_id: str, step: int) -> ModelResponse:
        tools = [tool.spec() for tool in self.tools.values() if await tool.is_enabled()]
        tools += self.request_options.server_tools
        wants_identity = self.request_options.user_id_from is not None  # caller() scans
        options = self.request_options.request_fields(self.caller()[0] if wants_identity else None)
        if self.output is not None:
            options = self.output.request_fields(options, self.request_options.thinks())

        def request() -> ModelRequest:
            return ModelRequest(
                model=self.model.name,
                system=self.system_prompt,
                messages=self.context.messages(self._system.history),
                tools=tools,
                max_tokens=self.max_output_tokens,
                **options,
            )

        live = self.wake.live

        def on_text(delta: str) -> None:
            live.text(delta, run_id=run_id, step=step)

        size = await self.context.over_limit(self._system.history, request)
        if size is not None:
            await self._shorten_for_step(run_id, tools, reason="budget", size=size)
        for attempt in (1, 2):
            self._check_lease()  # a zombie must not pay for a step the next owner makes
            try:
                return await self._race(self.model.complete(request(), on_text=on_text))
            except ModelError as exc:
                # Too long: shorten the conversation and try once more; else the run fails.
                if attempt == 1 and is_prompt_too_long(exc.status_code, str(exc)):
                    self.context.learn(str(exc))
                    if await self._shorten_for_step(run_id, tools, reason="prompt too long"):
                        continue
                if exc.retryable:
                    raise  # the run waits on a timer (_wait_out), then makes the step again
                # Invalid as sent: the run's content is left out of later requests.
                withdraw = exc.invalid_request and not is_prompt_too_long(exc.status_code, str(exc))
                raise _RunFailed(str(exc), withdrawn=withdraw) from exc
            finally:
                await live.drain()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- context management ---------------------------------------------------------

    async def _shorten(
        self,
        run_id: str | None,
        tools: list[dict[str, Any]],
        *,
        reason: str,
        mode: Mode | None = None,
        size: int | None = None,
        request: str = "",
    ) -> ConversationCompacted | None:
        """Journal (and commit) the compaction that shortens the conversation now, if
        anything can be cut. A crash before the commit loses nothing: the journal is
        whole, and the next attempt shortens it again."""
        event = await self.context.shorten(
            self._system.history,
            open_run=run_id,
            tools=tools,
            reason=reason,
            mode=mode,
            size=size,
            race=self._race,
        )
        if event is None or event.replaced == 0:
            return None
        event.request = request
        self.wake.log.info(
            "conversation %s: %d events (%d turns) replaced (%s, ~%d tokens before)",
            event.mode,
            event.replaced,
            event.turns,
            reason,
            event.tokens_before,
        )
        await self._journal(event)
        return event

    async def _shorten_for_step(
        self, run_id: str, tools: list[dict[str, Any]], *, reason: str, size: int | None = None
    ) -> ConversationCompacted | None:
        """:meth:`_shorten` before a step: a summary the model refuses fails the run
        (a transient failure retries the wake, which resumes here)."""
        try:
            return await self._shorten(run_id, tools, reason=reason, size=size)
        except ModelError as exc:
            if exc.retryable:
                raise
            raise _RunFailed(f"the conversation could not be compacted: {exc}") from exc

    async def compact_conversation(self, *, reason: str = "requested") -> bool:
        """Summarise the older turns now (the open run and the last ``keep_turns``
        turns stay as they are). False if there was nothing to compact."""
        return await self._on_demand("compact", reason)

    async def reset_conversation(self, *, reason: str = "requested") -> bool:
        """Drop every turn before the open run (all of them if none is open): the next
        run starts a fresh conversation. False if there was nothing to drop."""
        return await self._on_demand("reset", reason)

    async def _on_demand(self, mode: Mode, reason: str, request: str = "") -> bool:
        try:
            tools = [tool.spec() for tool in self.tools.values() if await tool.is_enabled()]
            event = await self._shorten(
                self._system.run, tools, reason=reason, mode=mode, request=request
            )
        except StopRun:
            raise ConversationError(f"the {mode} was interrupted: the wake was cancelled") from None
        except ModelError as exc:
            raise ConversationError(f"the conversation could not be compacted: {exc}") from exc
        return event is not None

    async def _take_conversation_requests(self) -> None:
        """Do what clients asked of the conversation (``rt.compact``, ``rt.reset_conversation``)
        in the inputs of this wake, once each (a replayed wake finds them done)."""
        done = self._system.conversation_upto
        for record in self.wake.inputs:
            event = record.event
            if not isinstance(event, ConversationRequested):
                continue
            if done and not id_gt(record.id, done):
                continue
            reason = f"requested by {event.by}"
            try:
                await self._on_demand(event.action, reason, request=record.id)
            except ConversationError as exc:
                self.wake.log.warning("%s of the conversation failed: %s", event.action, exc)

    def _progress(
        self, run_id: str, history: list[Any] | None = None
    ) -> tuple[list[AssistantStep], Usage]:
        """The run's model steps so far and their summed usage (``history``: the run's
        events, if the caller has them)."""
        events = self._run_history(run_id) if history is None else history
        steps = [e for e in events if isinstance(e, AssistantStep)]
        return steps, sum((Usage(**s.usage) for s in steps), Usage())

    async def _finish(
        self,
        run_id: str,
        status: RunEnd,
        *,
        error: str | None = None,
        withdrawn: bool = False,
        output: Any = None,
    ) -> RunResult:
        """End the run; ``output`` (JSON builtins) is its structured answer, if any."""
        run_events = self._run_history(run_id)
        if withdrawn or (
            status == "failed" and run_events and isinstance(run_events[-1], UserTurn)
        ):
            # No answer to close the turn: a note does, so the next message is its own turn.
            note = RunFailedNote(run_id=run_id, error=error or "", withdrawn=withdrawn)
            self.wake.activation.record(note)
        journaled, usage = self._progress(run_id, self._run_history(run_id))
        last = journaled[-1] if journaled else None
        steps = len(journaled)
        response = None
        if last is not None:
            # The text of the turn's last answer (a continued pause_turn adds steps to it).
            response = _answer_text(journaled)
        stop_reason = last.stop_reason if last is not None else None
        stop_sequence = last.stop_sequence if last is not None else None
        stop_details = last.stop_details if last is not None else None
        if status in ("truncated", "refused"):
            error = stop_error(stop_reason, stop_details, self.max_output_tokens)
        answered = status in ("completed", "truncated", "refused")
        calls = sum(len(tool_uses(s.content)) for s in journaled)
        output_type = (
            self.output.name if self.output is not None and status == "completed" else None
        )
        if output_type is not None:
            response = json.dumps(output, ensure_ascii=False)
        self.wake.activation.finish_run(
            status,
            response=response if answered else None,
            error=error,
            usage=msgspec.structs.asdict(usage),
            steps=steps,
            tool_calls=calls,
            stop_reason=stop_reason,
            stop_sequence=stop_sequence,
            stop_details=stop_details,
            output=output,
            output_type=output_type,
        )
        # Not a commit point of its own: the run's end is committed with the wake (with
        # the last step, and whatever the handler does after ``run()`` returns). A crash
        # or a failure of the handler before that resumes the journal and ends it again.
        return RunResult(
            run_id=run_id,
            status=status,
            response=response if answered else None,
            error=error,
            usage=usage,
            steps=steps,
            tool_calls=calls,
            stop_reason=stop_reason,
            stop_sequence=stop_sequence,
            stop_details=stop_details,
            output=self.output.value(output) if output_type and self.output else None,
            output_type=output_type,
        )

    async def _stopped(self, run_id: str) -> RunResult:
        signal = self.wake.signal
        if signal.kind != "cancel":
            raise WakeInterrupted(signal.reason or "interrupted")
        return await self._finish(run_id, "cancelled", error=signal.reason or "cancelled")

    def _check_signal(self) -> None:
        if self.wake.signal.cancelled or self.wake.signal.lease_lapsed():
            raise StopRun


def _settled(step: AssistantStep, history: list[Any]) -> bool:
    """Whether every call of ``step`` has a result in ``history`` (its run's events)."""
    calls = tool_uses(step.content)
    if not calls:
        return True
    done = {e.tool_call_id for e in history if isinstance(e, ToolOutcome)}
    return all(b["id"] in done for b in calls)


def schema_difference(one: AgentTool, other: AgentTool) -> str | None:
    """``"input schema"`` or ``"output schema"`` if the two tools' schemas differ."""
    if one.input_schema() != other.input_schema():
        return "input schema"
    if one.output_schema != other.output_schema:
        return "output schema"
    return None


async def _client_side(*_: Any) -> ToolResult:  # pragma: no cover - never called
    raise AssertionError("a client tool runs in the client")


class _RunFailed(Exception):
    """The run fails with this message; ``withdrawn``: the API refused its request as
    invalid, so its content is left out of later requests."""

    def __init__(self, message: str, *, withdrawn: bool = False) -> None:
        super().__init__(message)
        self.withdrawn = withdrawn


def _answer_text(steps: list[AssistantStep]) -> str:
    """The text of the last answer: the last step's, with the steps it continued (a
    ``pause_turn`` step and the one after it are one turn)."""
    first = len(steps) - 1
    while first > 0 and steps[first - 1].stop_reason in CONTINUED:
        first -= 1
    return "".join(
        b.get("text", "") for s in steps[first:] for b in s.content if b.get("type") == "text"
    )


class _Unavailable:
    """The model of an agent whose model cannot be built (no API key): every call fails
    at once with why, so each run fails with it and the entity goes on."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    async def complete(self, request: ModelRequest, *, on_text: Any = None) -> ModelResponse:
        raise ModelError(self.reason, retryable=False, model=self.name)
