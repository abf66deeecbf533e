"""The runtime's own tools (``ctx.runtime_tools``): message, spawn an agent, schedule a
message, and the recurring schedules (``upsert_cron_schedule``, ``list_schedules``,
``delete_schedule``).

Their names must leave the names a user's own tools take in the documented examples
free (``memory_store``, ``dispatch``, ``calculator``): ``tools=[*ctx.runtime_tools,
dispatch_tool]`` must work. The spawning tool was called ``dispatch`` before; a call
journaled under that name still finds it (``AgentTool.former_names``) unless the
agent has a tool of its own named ``dispatch``. Each has a stable id
(``wakeful.runtime.<name>/v1``), recorded with its persisted calls.

Effects made inside a tool call get idempotency keys and child ids derived
from the ``tool_call_id`` (see ``Activation.next_key``), so a call that is run
again after a crash sends nothing twice and spawns no second child.

The input structs are defined once, here; the typed versions of these tools
(``wakeful.tools.typed``) take the same inputs.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any, cast

import msgspec

from .agent_tools import AgentTool, ToolResult
from .cancellation import CancelSignal
from .errors import InvalidScheduleError
from .urls import parse_url
from .wake import Wake

if TYPE_CHECKING:
    from .context import HandlerContext


class SendMessage(msgspec.Struct):
    url: Annotated[str, msgspec.Meta(description="Entity URL, /<type>/<id>")]
    text: Annotated[str, msgspec.Meta(description="The message")]


class Dispatch(msgspec.Struct):
    agent: Annotated[str, msgspec.Meta(description="Entity type of the agent to dispatch to")]
    task: Annotated[str, msgspec.Meta(description="What the agent should do, self-contained")]


class ScheduleMessage(msgspec.Struct):
    url: Annotated[
        str, msgspec.Meta(description="Entity URL, /<type>/<id>; use your own to set a reminder")
    ]
    text: str
    delay_seconds: Annotated[float, msgspec.Meta(ge=0, description="Seconds from now")]


class UpsertCronSchedule(msgspec.Struct):
    id: Annotated[
        str, msgspec.Meta(description="Your id for the schedule; the same id replaces it")
    ]
    expression: Annotated[
        str,
        msgspec.Meta(
            description="Cron expression, 5 fields: minute hour day-of-month month "
            "day-of-week, e.g. '0 9 * * 1-5' (weekdays at 09:00)"
        ),
    ]
    timezone: Annotated[
        str, msgspec.Meta(description="IANA time zone of the expression, e.g. 'Europe/Berlin'")
    ] = "UTC"
    payload: Annotated[
        Any, msgspec.Meta(description="What you receive at each occurrence, e.g. a reminder")
    ] = None


class ListSchedules(msgspec.Struct):
    pass


class DeleteSchedule(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(description="A schedule id from list_schedules")]


def _seconds_until(due_ms: int) -> float:
    return round(max(0.0, due_ms / 1000 - time.time()), 1)


def runtime_tool_manifest() -> list[dict[str, Any]]:
    """The runtime tools as ``wakeful manifest`` lists them (no wake needed: the tools
    only use their context when they run)."""
    return [t.manifest() for t in runtime_tools(cast("HandlerContext", None))]


def runtime_tools(ctx: HandlerContext) -> list[AgentTool]:
    async def send_message(
        call_id: str, p: SendMessage, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        parse_url(p.url)
        await ctx.send(p.url, p.text)
        return ToolResult(f"Message sent to {p.url}.", details={"url": p.url})

    async def spawn_agent(
        call_id: str, p: Dispatch, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        child = await ctx.spawn(
            p.agent,
            ctx.derive_id(p.agent),
            initial_message=p.task,
            wake=Wake.run_finished(include_response=True),
        )
        return ToolResult(
            f"Dispatched to {child.entity_url}. It works in the background; you will be "
            "woken with its result when it finishes. Do not wait for it now.",
            details={"child": child.entity_url},
        )

    async def schedule_message(
        call_id: str, p: ScheduleMessage, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        parse_url(p.url)
        await ctx.send(p.url, p.text, after=p.delay_seconds)
        return ToolResult(f"Message to {p.url} scheduled in {p.delay_seconds:g} s.")

    async def upsert_cron_schedule(
        call_id: str, p: UpsertCronSchedule, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        try:
            schedule = await ctx.upsert_cron_schedule(
                p.id, p.expression, timezone=p.timezone, payload=p.payload
            )
        except InvalidScheduleError as exc:
            return ToolResult(str(exc), is_error=True)
        when = schedule.next_at.isoformat(timespec="minutes")
        return ToolResult(
            f"Schedule {schedule.id!r} ({schedule.expression}, {schedule.timezone}) is set; "
            f"its next occurrence is {when}.",
            details={"id": schedule.id, "next_ms": schedule.next_ms},
        )

    async def list_schedules(
        call_id: str, p: ListSchedules, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        recurring = [
            {
                "id": s.id,
                "kind": "recurring",
                "expression": s.expression,
                "timezone": s.timezone,
                "payload": s.payload,
                "next": s.next_at.isoformat(timespec="minutes"),
                "due_in_seconds": _seconds_until(s.next_ms),
            }
            for s in await ctx.cron_schedules()
        ]
        messages = [
            {
                "id": t.id,
                "kind": "message",
                "url": t.target,
                "payload": t.payload,
                "due_in_seconds": _seconds_until(t.due_ms),
            }
            for t in await ctx.schedules()
        ]
        listing = recurring + messages
        text = json.dumps(listing, ensure_ascii=False) if listing else "No schedules."
        return ToolResult(text, details={"schedules": listing})

    async def delete_schedule(
        call_id: str, p: DeleteSchedule, signal: CancelSignal, on_update: Any
    ) -> ToolResult:
        try:
            deleted = await ctx.delete_cron_schedule(p.id)
        except InvalidScheduleError:
            deleted = False  # not a recurring schedule's id: perhaps a scheduled message's
        if not deleted:
            deleted = await ctx.cancel_schedule(p.id)
        if not deleted:
            return ToolResult(f"No schedule {p.id!r} (see list_schedules).", is_error=True)
        return ToolResult(f"Schedule {p.id!r} deleted.", details={"id": p.id})

    return [
        AgentTool(
            "send_message",
            "Send a text message to another entity.",
            SendMessage,
            send_message,
            id="wakeful.runtime.send_message/v1",
        ),
        AgentTool(
            "spawn_agent",
            "Hand a task to a new child agent of the given type. Returns at once; you are "
            "woken with the child's answer when its run finishes.",
            Dispatch,
            spawn_agent,
            id="wakeful.runtime.spawn_agent/v1",
            former_names=("dispatch",),
        ),
        AgentTool(
            "schedule_message",
            "Send a message later (a durable timer that survives restarts).",
            ScheduleMessage,
            schedule_message,
            id="wakeful.runtime.schedule_message/v1",
        ),
        AgentTool(
            "upsert_cron_schedule",
            "Create or replace a recurring schedule of yours: at each occurrence of the cron "
            "expression (in its time zone) you are woken with its payload. Survives restarts.",
            UpsertCronSchedule,
            upsert_cron_schedule,
            id="wakeful.runtime.upsert_cron_schedule/v1",
        ),
        AgentTool(
            "list_schedules",
            "List your recurring schedules and your pending scheduled messages.",
            ListSchedules,
            list_schedules,
            id="wakeful.runtime.list_schedules/v1",
        ),
        AgentTool(
            "delete_schedule",
            "Delete a recurring schedule, or cancel a pending scheduled message, by its id.",
            DeleteSchedule,
            delete_schedule,
            id="wakeful.runtime.delete_schedule/v1",
        ),
    ]
