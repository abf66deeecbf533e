"""The runtime's own tools (``ctx.runtime_tools``): message, spawn an agent, schedule.

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

from typing import TYPE_CHECKING, Annotated, Any, cast

import msgspec

from .agent_tools import AgentTool, ToolResult
from .cancellation import CancelSignal
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
    ]
