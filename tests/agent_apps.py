"""A ``bot`` that runs one agent, the model's side of its tool calls, and what a run
journaled: what the agent tests script (``use`` a tool, a ``step`` of calls) and read
back (the results a request carries, the outcomes and other events of the log)."""

from __future__ import annotations

from typing import Any

import msgspec

from wakeful import AgentDef, HandlerContext, LogRecord, Registry, Runtime, ToolContext, define_tool
from wakeful.events import ToolOutcome
from wakeful.models import ModelRequest, ModelResponse

URL = "/bot/b"


class Text(msgspec.Struct):
    text: str


class Upper(msgspec.Struct):
    upper: str


class UserCtx(msgspec.Struct):
    user_id: str


def upper_tool(
    executions: list[str] | None = None, id: str = "acme.upper/v1", **options: Any
) -> Any:
    """A tool that uppercases ``Text``; ``executions`` collects the call ids it ran."""

    async def execute(ctx: ToolContext[Text, None]) -> Upper:
        if executions is not None:
            executions.append(ctx.tool_call_id)
        return Upper(ctx.input.text.upper())

    return define_tool(
        id=id, description="Uppercase a text.", input=Text, output=Upper, execute=execute, **options
    )


def use(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    """A ``tool_use`` block: the model calls ``name`` with ``arguments``."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def step(*calls: dict[str, Any]) -> ModelResponse:
    """A model step that makes ``calls`` (and stops for their results)."""
    return ModelResponse(content=list(calls), stop_reason="tool_use")


def results_in(request: ModelRequest) -> dict[str, dict[str, Any]]:
    """The tool results a request carries back to the model, by call id."""
    return {b["tool_use_id"]: b for b in request.messages[-1]["content"]}


def app(agent: AgentDef, **use_options: Any) -> Registry:
    """``bot``: runs ``agent`` (``ctx.use_agent(agent, **use_options)``) on each wake."""
    reg = Registry()
    reg.agent(agent)

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(agent, **use_options)
        await ctx.agent.run()

    return reg


async def outcomes(rt: Runtime, url: str = URL) -> dict[str, ToolOutcome]:
    """The journaled tool results of ``url``, by call id."""
    return {e.tool_call_id: e for e in await rt.history(url) if isinstance(e, ToolOutcome)}


async def events_of(rt: Runtime, url: str, kind: type) -> list[Any]:
    """The events of ``kind`` in ``url``'s log, oldest first."""
    return [
        r.event
        async for r in rt.events(url)
        if isinstance(r, LogRecord) and isinstance(r.event, kind)
    ]
