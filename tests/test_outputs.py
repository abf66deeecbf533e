"""Observing tool output (issue 14, items 9-12 and 14): what ``on_output`` sees, when, and
what a bug leaves for clients and for operators."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import pytest

from tests.agent_apps import URL, Text, Upper, app, outcomes, results_in, step, use
from tests.gateway_apps import http_for
from tests.test_contracts import upper_tool
from wakeful import (
    HandlerContext,
    HandlerFailed,
    Lifecycle,
    Registration,
    Registry,
    RunFailedError,
    ScriptedModel,
    ToolContext,
    define_agent,
    tool,
)
from wakeful.contracts import OutputInfo, RuntimeErrorInfo, ToolOutcomeInfo

pytestmark = pytest.mark.anyio


async def test_an_async_on_output_is_awaited_before_the_model_sees_the_output(cluster):
    order: list[str] = []

    async def on_output(info: OutputInfo) -> None:
        await asyncio.sleep(0)  # a real suspension point: the observer is awaited, not called
        order.append(f"observed {info.output.upper}")

    def respond(request: Any) -> Any:
        if len(request.messages) == 1:
            return step(use("c1", "up", text="hi"))
        order.append("model")
        return "ok"

    agent = define_agent(
        name="async_observer",
        instructions=".",
        model=ScriptedModel(respond),
        tools={"up": Registration(upper_tool(), on_output=on_output)},
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    assert order == ["observed HI", "model"]


async def test_an_output_the_lifecycle_hook_breaks_is_a_bug_never_an_output(cluster):
    observed: list[Any] = []

    def after(outcome: ToolOutcomeInfo) -> ToolOutcomeInfo:
        outcome.output = {"upper": 42}  # not an Upper
        return outcome

    model = ScriptedModel([step(use("c1", "up", text="hi")), "never"])
    agent = define_agent(
        name="broken_hook",
        instructions=".",
        model=model,
        tools={"up": Registration(upper_tool(), on_output=observed.append)},
        lifecycle=Lifecycle(after_tool_result=after),
    )
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    assert failed.value.error == "internal error in tool 'up' (call c1)"
    assert observed == []
    assert len(model.requests) == 1  # the model never saw it
    result = (await outcomes(rt))["c1"]
    assert result.is_error and "output" not in (result.details or {})


async def test_the_lifecycle_hook_output_reaches_on_output_validated(cluster):
    observed: list[Any] = []

    def after(outcome: ToolOutcomeInfo) -> ToolOutcomeInfo:
        outcome.output = {"upper": "FROM HOOK"}  # JSON that fits the output schema
        return outcome

    agent = define_agent(
        name="fixing_hook",
        instructions=".",
        model=ScriptedModel([step(use("c1", "up", text="hi")), "ok"]),
        tools={"up": Registration(upper_tool(), on_output=lambda i: observed.append(i.output))},
        lifecycle=Lifecycle(after_tool_result=after),
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    assert observed == [Upper("FROM HOOK")]  # converted to the output type


class Items(msgspec.Struct):
    items: list[str]


async def test_on_output_cannot_rewrite_the_stored_result_or_what_the_model_sees(cluster):
    @tool(id="acme.items/v1", description=".", input=Text, output=Items)
    async def items(ctx: ToolContext[Text, None]) -> Items:
        return Items([ctx.input.text])

    def on_output(info: OutputInfo) -> None:
        info.output.items.append("injected")
        info.output.items[0] = "rewritten"

    model = ScriptedModel([step(use("c1", "items", text="mine")), "ok"])
    agent = define_agent(
        name="rewriting",
        instructions=".",
        model=model,
        tools={"items": Registration(items, on_output=on_output)},
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    assert (await outcomes(rt))["c1"].details == {"output": {"items": ["mine"]}}
    seen = results_in(model.requests[1])["c1"]["content"][0]["text"]
    assert "injected" not in seen and "rewritten" not in seen and "mine" in seen


async def test_a_failure_turned_into_an_output_reaches_on_output_with_its_input(cluster):
    observed: list[OutputInfo] = []

    def after(outcome: ToolOutcomeInfo) -> ToolOutcomeInfo:
        if outcome.error is not None:
            return ToolOutcomeInfo(outcome.name, outcome.tool_call_id, output=Upper("RECOVERED"))
        return outcome

    @tool(id="acme.failing/v1", description=".", input=Text, output=Upper)
    async def failing(ctx: ToolContext[Text, None]) -> Upper:
        ctx.fail("failed on purpose")

    model = ScriptedModel(
        [step(use("planned", "failing", text="a"), use("refused", "off", text="b")), "ok"]
    )
    agent = define_agent(
        name="recovering",
        instructions=".",
        model=model,
        tools={
            "failing": Registration(failing, on_output=observed.append),
            # A disabled tool: the loop refuses the call itself, without running it.
            "off": Registration(upper_tool(), enabled=False, on_output=observed.append),
        },
        lifecycle=Lifecycle(after_tool_result=after),
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    by_call = {o.tool_call_id: o for o in observed}
    assert by_call["planned"].input == Text("a")
    assert by_call["refused"].input == Text("b")
    assert by_call["refused"].output == Upper("RECOVERED")


# -- bugs: on_runtime_error, redaction -----------------------------------------------------

SECRET = "sk-live-0123456789"


def leaking_tool() -> Any:
    @tool(id="acme.leaky/v1", description=".", input=Text, output=Upper)
    async def leaky(ctx: ToolContext[Text, None]) -> Upper:
        api_key = SECRET  # noqa: F841 - a local a traceback would show
        raise RuntimeError(f"the upstream refused key {SECRET}")

    return leaky


async def test_a_bug_reaches_on_runtime_error_in_full_and_clients_see_it_redacted(cluster, caplog):
    caplog.set_level(logging.ERROR, logger="wakeful.entity.bot")
    reported: list[RuntimeErrorInfo] = []

    async def on_runtime_error(info: RuntimeErrorInfo) -> None:
        reported.append(info)

    agent = define_agent(
        name="leaking",
        instructions=".",
        model=ScriptedModel([step(use("c1", "leaky", text="a")), "never"]),
        tools={"leaky": leaking_tool()},
        on_runtime_error=on_runtime_error,
    )
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    public = "internal error in tool 'leaky' (call c1)"
    assert failed.value.error == public
    # The hook: the full error, once.
    [info] = reported
    assert (info.entity_url, info.tool, info.tool_call_id, info.error) == (
        URL,
        "leaky",
        "c1",
        public,
    )
    assert SECRET in info.detail and "Traceback" in info.detail
    assert isinstance(info.exception, RuntimeError)
    # Operators: the runtime_error event, through the client API.
    [recorded] = await rt.runtime_errors(URL)
    assert recorded.tool_call_id == "c1" and SECRET in recorded.detail
    # Clients: the tool result and everything the gateway streams, without the secret.
    assert (await outcomes(rt))["c1"].details == {"error": public}
    http = http_for(rt)
    async with http:
        stream = await http.get("/entities/bot/b/events?follow=0")
    assert stream.status_code == 200
    assert "run_finished" in stream.text and public in stream.text
    assert SECRET not in stream.text and "Traceback" not in stream.text
    assert "runtime_error" not in stream.text
    # The worker log has it in full.
    logged = [r.getMessage() for r in caplog.records if r.name == "wakeful.entity.bot"]
    assert any(public in m and SECRET in m for m in logged)


@pytest.mark.parametrize("where", ["on_output", "invalid_output"])
async def test_every_kind_of_bug_is_reported_to_on_runtime_error(cluster, where):
    reported: list[RuntimeErrorInfo] = []

    def on_output(info: OutputInfo) -> None:
        raise ValueError(f"observer saw {SECRET}")

    @tool(id="acme.invalid/v1", description=".", input=Text, output=Upper)
    async def invalid(ctx: ToolContext[Text, None]) -> Upper:
        return {"upper": 42}  # type: ignore[return-value]

    if where == "on_output":
        tools = {"t": Registration(upper_tool(), on_output=on_output)}
    else:
        tools = {"t": Registration(invalid)}
    agent = define_agent(
        name="bugs",
        instructions=".",
        model=ScriptedModel([step(use("c1", "t", text="a")), "never"]),
        tools=tools,
        on_runtime_error=reported.append,
    )
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError):
        await rt.ask(URL, "go")
    [info] = reported
    assert info.tool_call_id == "c1"
    assert (SECRET if where == "on_output" else "does not match Upper") in info.detail
    assert [e.tool_call_id for e in await rt.runtime_errors(URL)] == ["c1"]


async def test_a_raising_on_runtime_error_hook_does_not_hide_the_failure(cluster):
    def on_runtime_error(info: RuntimeErrorInfo) -> None:
        raise RuntimeError("the pager is down")

    agent = define_agent(
        name="broken_pager",
        instructions=".",
        model=ScriptedModel([step(use("c1", "leaky", text="a")), "never"]),
        tools={"leaky": leaking_tool()},
        on_runtime_error=on_runtime_error,
    )
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    assert failed.value.error == "internal error in tool 'leaky' (call c1)"


async def test_a_handlers_traceback_stays_with_operators(cluster):
    """A handler's own exception: its ``handler_error`` reaches SSE clients without the
    traceback (whose frames show the code's internals); ``rt.events`` keeps it in full."""
    reg = Registry()

    @reg.entity("fails")
    async def fails(ctx: HandlerContext) -> None:
        raise RuntimeError("the handler broke")

    rt = await cluster.runtime(reg, max_attempts=1)
    await rt.send("/fails/f", "hi")
    assert (await rt.wait_idle("/fails/f", timeout=30)).status == "failed"
    [failure] = [r.event async for r in rt.events("/fails/f") if isinstance(r.event, HandlerFailed)]
    assert "Traceback" in failure.traceback and "test_outputs.py" in failure.traceback
    http = http_for(rt)
    async with http:
        stream = await http.get("/entities/fails/f/events?follow=0")
    assert stream.status_code == 200
    assert "handler_error" in stream.text and "the handler broke" in stream.text
    assert "Traceback" not in stream.text and "test_outputs.py" not in stream.text
