"""Typed versions of the ready-made tools, with stable ids (``wakeful.<name>/v1``).

``typed_tools(handler_ctx)`` returns tool definitions bound to the entity awake
in ``handler_ctx``; register them in a ``define_agent(tools=...)`` built in the
handler. Effects made inside a call (messages, children, timers) get keys and
ids derived from the ``tool_call_id``, so a call run again after a crash sends
nothing twice and spawns no second child; and a call's writes commit with its
result. So these tools opt in to ``rerun_in_doubt``: a call interrupted by a
worker stop runs again, with the same ``tool_call_id``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec

from wakeful.contracts import ToolContext, ToolDef, define_tool
from wakeful.runtime_tools import Dispatch, ScheduleMessage, SendMessage
from wakeful.urls import parse_url
from wakeful.wake import Wake

from .calculator import Calculation, CalculationError, evaluate, format_number
from .memory import MemoryRequest as MemoryInput
from .memory import Note, _preview, _problem

if TYPE_CHECKING:
    from wakeful.context import HandlerContext

In = TypeVar("In")
Out = TypeVar("Out")

__all__ = [
    "CalculatorOutput",
    "DispatchInput",
    "DispatchOutput",
    "MemoryInput",
    "MemoryOutput",
    "ScheduleInput",
    "SendInput",
    "SentOutput",
    "typed_tools",
]


class MemoryOutput(msgspec.Struct, omit_defaults=True):
    action: Literal["get", "set", "delete", "list"]
    key: str | None = None
    found: bool | None = None
    value: str | None = None
    replaced: str | None = None
    keys: list[str] | None = None


# The inputs of the runtime's own tools (runtime_tools.py), under the names the typed
# contracts publish (a subclass keeps the fields in one place and the schema's title).
class SendInput(SendMessage):
    pass


class SentOutput(msgspec.Struct):
    url: str
    after_seconds: float | None = None


class DispatchInput(Dispatch):
    pass


class DispatchOutput(msgspec.Struct):
    child: str


class CalculatorOutput(msgspec.Struct):
    expression: str
    result: float | int
    text: str


class ScheduleInput(ScheduleMessage):
    pass


class NoInput(msgspec.Struct):
    pass


class ScheduledItem(msgspec.Struct):
    id: str
    url: str
    text: Any
    due_in_seconds: float


class ScheduleList(msgspec.Struct):
    schedules: list[ScheduledItem]


class CancelInput(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(description="A schedule id from list_schedules")]


class CancelOutput(msgspec.Struct):
    id: str
    cancelled: bool


def _ready_made(
    name: str,
    *,
    description: str,
    input: type[In],
    output: type[Out],
    execute: Callable[[ToolContext[In, None]], Awaitable[Out]],
    to_model_output: Callable[[Out], str] | None = None,
) -> tuple[str, ToolDef[Any, Any, None]]:
    """One of these tools under its usual name, with the id ``wakeful.<name>/v1``; every
    one opts in to ``rerun_in_doubt`` (see the module's docstring)."""
    return name, define_tool(
        id=f"wakeful.{name}/v1",
        description=description,
        input=input,
        output=output,
        execute=execute,
        to_model_output=to_model_output,
        rerun_in_doubt=True,
    )


def typed_tools(
    handler_ctx: HandlerContext, collection: str = "kv"
) -> dict[str, ToolDef[Any, Any, None]]:
    """The ready-made tools as typed contracts, keyed by their usual names."""

    async def memory(ctx: ToolContext[MemoryInput, None]) -> MemoryOutput:
        p = ctx.input
        problem = _problem(p)
        if problem is not None:
            ctx.fail(f"Invalid memory call: {problem}.")
        rows = handler_ctx.db.collections[collection]
        actions = handler_ctx.db.actions
        key = (p.key or "").strip()
        if p.action == "list":
            return MemoryOutput("list", keys=[n.key for n in rows.to_list()])
        current: Note | None = rows.get(key)
        if p.action == "get":
            found = current is not None
            value = current.value if current is not None else None
            return MemoryOutput("get", key=key, found=found, value=value)
        if p.action == "delete":
            if current is not None:
                getattr(actions, f"{collection}_delete")(key=key)
            return MemoryOutput("delete", key=key, found=current is not None)
        value = p.value or ""
        if current is None:
            getattr(actions, f"{collection}_insert")(row=Note(key, value))
            return MemoryOutput("set", key=key)

        def replace(note: Note) -> None:
            note.value = value

        getattr(actions, f"{collection}_update")(key=key, updater=replace)
        return MemoryOutput("set", key=key, replaced=_preview(current.value))

    async def send_message(ctx: ToolContext[SendInput, None]) -> SentOutput:
        try:
            parse_url(ctx.input.url)
        except Exception as exc:
            ctx.fail(f"Invalid url {ctx.input.url!r}: {exc}")
        await handler_ctx.send(ctx.input.url, ctx.input.text)
        return SentOutput(ctx.input.url)

    async def dispatch(ctx: ToolContext[DispatchInput, None]) -> DispatchOutput:
        # derive_id inside a tool call digests the call's id: replays get the same child.
        child = await handler_ctx.spawn(
            ctx.input.agent,
            handler_ctx.derive_id(ctx.input.agent),
            initial_message=ctx.input.task,
            wake=Wake.run_finished(include_response=True),
        )
        return DispatchOutput(child.entity_url)

    async def calculator(ctx: ToolContext[Calculation, None]) -> CalculatorOutput:
        try:
            value = evaluate(ctx.input.expression)
        except CalculationError as exc:
            ctx.fail(str(exc))
        return CalculatorOutput(ctx.input.expression, value, format_number(value))

    async def schedule_message(ctx: ToolContext[ScheduleInput, None]) -> SentOutput:
        try:
            parse_url(ctx.input.url)
        except Exception as exc:
            ctx.fail(f"Invalid url {ctx.input.url!r}: {exc}")
        await handler_ctx.send(ctx.input.url, ctx.input.text, after=ctx.input.delay_seconds)
        return SentOutput(ctx.input.url, after_seconds=ctx.input.delay_seconds)

    async def list_schedules(ctx: ToolContext[NoInput, None]) -> ScheduleList:
        now_ms = time.time() * 1000
        return ScheduleList(
            [
                ScheduledItem(
                    s.id, s.target, s.payload, round(max(0.0, s.due_ms - now_ms) / 1000, 1)
                )
                for s in await handler_ctx.schedules()
            ]
        )

    async def cancel_schedule(ctx: ToolContext[CancelInput, None]) -> CancelOutput:
        if not await handler_ctx.cancel_schedule(ctx.input.id):
            ctx.fail(f"No pending schedule {ctx.input.id!r} (it fired, or was cancelled).")
        return CancelOutput(ctx.input.id, True)

    def dispatched(output: DispatchOutput) -> str:
        return (
            f"Dispatched to {output.child}. It works in the background; you will be woken "
            "with its result when it finishes. Do not wait for it now."
        )

    def calculated(output: CalculatorOutput) -> str:
        return f"{output.expression} = {output.text}"

    return dict(
        [
            _ready_made(
                "memory",
                description="Your long-term memory, kept across conversations and restarts: get, "
                "set, delete or list short facts by key.",
                input=MemoryInput,
                output=MemoryOutput,
                execute=memory,
            ),
            _ready_made(
                "send_message",
                description="Send a text message to another entity.",
                input=SendInput,
                output=SentOutput,
                execute=send_message,
            ),
            _ready_made(
                "dispatch",
                description="Hand a task to a new child agent of the given type. Returns at once; "
                "you are woken with the child's answer when its run finishes.",
                input=DispatchInput,
                output=DispatchOutput,
                execute=dispatch,
                to_model_output=dispatched,
            ),
            _ready_made(
                "calculator",
                description="Evaluate an arithmetic expression exactly (never guess arithmetic).",
                input=Calculation,
                output=CalculatorOutput,
                execute=calculator,
                to_model_output=calculated,
            ),
            _ready_made(
                "schedule_message",
                description="Send a message later (a durable timer that survives restarts).",
                input=ScheduleInput,
                output=SentOutput,
                execute=schedule_message,
            ),
            _ready_made(
                "list_schedules",
                description="List your pending scheduled messages (id, url, text, seconds left).",
                input=NoInput,
                output=ScheduleList,
                execute=list_schedules,
            ),
            _ready_made(
                "cancel_schedule",
                description="Cancel a pending scheduled message by its id.",
                input=CancelInput,
                output=CancelOutput,
                execute=cancel_schedule,
            ),
        ]
    )
