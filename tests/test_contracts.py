"""Typed tool contracts (issue 5): one test per rule, end to end through a runtime."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import msgspec
import pytest

from tests.agent_apps import (
    URL,
    Text,
    Upper,
    UserCtx,
    app,
    outcomes,
    results_in,
    step,
    upper_tool,
    use,
)
from wakeful import (
    AgentDef,
    Capability,
    HandlerContext,
    Lifecycle,
    Registration,
    Registry,
    RunFailedError,
    RunFinished,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolContractError,
    define_agent,
    define_tool,
    tool,
)
from wakeful.contracts import CallInfo, OutputInfo, ToolOutcomeInfo
from wakeful.events import ToolIntent
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio


class Count(msgspec.Struct):
    n: int


class AppCtx(msgspec.Struct):
    user_id: str
    org_id: str
    secret_scope: str = "all"


def tool_names(request: ModelRequest) -> list[str]:
    return [t["name"] for t in request.tools]


async def finished(rt: Runtime, url: str = URL) -> list[RunFinished]:
    return [r.event async for r in rt.events(url) if isinstance(r.event, RunFinished)]


async def runtime_with(cluster: Any, reg: Registry, capabilities: list[Any]) -> Runtime:
    rt = Runtime(
        reg,
        settings=cluster.settings(),
        redis=cluster.redis(),
        capabilities=capabilities,
        run_worker=True,
    )
    await rt.start()
    cluster.runtimes.append(rt)
    return rt


# -- ids and schemas ----------------------------------------------------------------


async def test_two_registrations_can_share_one_tool_id(cluster):
    executions: list[str] = []
    upper = upper_tool(executions)
    model = ScriptedModel([step(use("a", "upper", text="x"), use("b", "shout", text="y")), "done"])
    agent = define_agent(
        name="aliases", instructions=".", model=model, tools={"upper": upper, "shout": upper}
    )
    reg = app(agent)
    [manifest] = reg.manifest()["agents"]
    assert [(t["key"], t["id"]) for t in manifest["tools"]] == [
        ("upper", "acme.upper/v1"),
        ("shout", "acme.upper/v1"),
    ]
    rt = await cluster.runtime(reg)
    assert await rt.ask(URL, "go") == "done"
    assert sorted(executions) == ["a", "b"]
    assert sorted(tool_names(model.requests[0])) == ["shout", "upper"]
    done = await outcomes(rt)
    assert done["a"].details == {"output": {"upper": "X"}}
    assert done["b"].details == {"output": {"upper": "Y"}}


async def test_input_and_output_schemas_are_in_the_manifest():
    agent = define_agent(name="schemas", instructions=".", model="x", tools={"up": upper_tool()})
    reg = Registry()
    reg.agent(agent)
    [entry] = reg.manifest()["agents"][0]["tools"]
    assert entry["input_schema"]["properties"] == {"text": {"type": "string"}}
    assert entry["input_schema"]["required"] == ["text"]
    assert entry["output_schema"]["properties"] == {"upper": {"type": "string"}}
    assert entry["description"] == "Uppercase a text."


# -- failures ------------------------------------------------------------------------


async def test_an_output_that_breaks_the_output_schema_fails_the_run(cluster):
    async def execute(ctx: ToolContext[Text, None]) -> Any:
        return {"n": "not a number"}

    broken = define_tool(
        id="acme.count/v1", description=".", input=Text, output=Count, execute=execute
    )
    model = ScriptedModel([step(use("c1", "count", text="x")), "never"])
    agent = define_agent(name="broken", instructions=".", model=model, tools={"count": broken})
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    assert failed.value.error == "internal error in tool 'count' (call c1)"
    [run] = await finished(rt)
    assert (run.status, run.error) == ("failed", "internal error in tool 'count' (call c1)")
    outcome = (await outcomes(rt))["c1"]
    assert outcome.is_error
    assert "traceback" not in outcome.details  # the full error is for operators only
    [bug] = await rt.runtime_errors(URL)
    assert "output does not match Count" in bug.detail
    assert len(model.requests) == 1  # the model never sees the broken output


async def test_ctx_fail_is_a_failed_result_for_the_model_and_the_run_goes_on(cluster):
    executions: list[str] = []

    @tool(id="acme.picky/v1", description=".", input=Text, output=Upper)
    async def picky(ctx: ToolContext[Text, None]) -> Upper:
        executions.append(ctx.tool_call_id)
        ctx.fail("texts must be short", data={"limit": 3})

    model = ScriptedModel([step(use("c1", "picky", text="long text")), "gave up"])
    agent = define_agent(name="picky", instructions=".", model=model, tools={"picky": picky})
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "gave up"
    assert executions == ["c1"]
    result = results_in(model.requests[1])["c1"]
    assert result["is_error"] and result["content"][0]["text"] == "texts must be short"
    outcome = (await outcomes(rt))["c1"]
    assert outcome.details == {"error": "texts must be short", "data": {"limit": 3}}
    [run] = await finished(rt)
    assert run.status == "completed"


async def test_an_exception_fails_the_run_and_clients_see_a_redacted_error(cluster):
    executions: list[str] = []

    @tool(id="acme.leaky/v1", description=".", input=Text, output=Upper)
    async def leaky(ctx: ToolContext[Text, None]) -> Upper:
        executions.append(ctx.tool_call_id)
        raise RuntimeError("password=hunter2")

    model = ScriptedModel([step(use("c1", "leaky", text="x")), "never"])
    agent = define_agent(name="leaky", instructions=".", model=model, tools={"leaky": leaky})
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    assert "hunter2" not in str(failed.value) and "hunter2" not in (failed.value.error or "")
    assert failed.value.error == "internal error in tool 'leaky' (call c1)"
    [run] = await finished(rt)
    assert run.status == "failed" and "hunter2" not in (run.error or "")
    outcome = (await outcomes(rt))["c1"]
    assert "hunter2" not in outcome.content[0]["text"]
    assert "hunter2" not in repr(outcome.details)
    [bug] = await rt.runtime_errors(URL)
    assert "RuntimeError: password=hunter2" in bug.detail
    assert executions == ["c1"]
    assert len(model.requests) == 1


async def test_execute_is_never_retried_and_its_call_id_is_the_journal_id(cluster):
    seen: list[str] = []

    @tool(id="acme.flaky/v1", description=".", input=Text, output=Upper)
    async def flaky(ctx: ToolContext[Text, None]) -> Upper:
        seen.append(ctx.tool_call_id)
        if ctx.input.text == "boom":
            raise ConnectionError("transient")
        if ctx.input.text == "fail":
            ctx.fail("no")
        return Upper(ctx.input.text.upper())

    model = ScriptedModel(
        [
            step(use("ok1", "flaky", text="a"), use("f1", "flaky", text="fail")),
            "fine",
            step(use("b1", "flaky", text="boom")),
            "never",
        ]
    )
    agent = define_agent(name="flaky", instructions=".", model=model, tools={"flaky": flaky})
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "fine"
    assert sorted(seen) == ["f1", "ok1"]  # a planned failure is not retried either
    history = await rt.history(URL)
    journaled = [c.id for e in history if isinstance(e, ToolIntent) for c in e.calls]
    assert sorted(journaled) == sorted(seen)
    assert set(await outcomes(rt)) == set(seen)

    seen.clear()
    with pytest.raises(RunFailedError):
        await rt.ask(URL, "go")
    await asyncio.sleep(0.3)  # long enough for any retry with backoff
    assert seen == ["b1"]
    assert len(model.requests) == 3
    assert (await rt.status(URL)).status != "failed"  # the run failed, not the entity


# -- model output ---------------------------------------------------------------------


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class Picture(msgspec.Struct):
    png_base64: str
    width: int


async def test_to_model_output_sends_an_image_while_the_stored_result_stays_json(cluster):
    async def render(ctx: ToolContext[Text, None]) -> Picture:
        return Picture(base64.b64encode(PNG).decode(), 1)

    def as_image(output: Picture) -> list[dict[str, Any]]:
        return [
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": output.png_base64},
            }
        ]

    render_tool = define_tool(
        id="acme.render/v1",
        description=".",
        input=Text,
        output=Picture,
        execute=render,
        to_model_output=as_image,
    )
    model = ScriptedModel([step(use("r1", "render", text="dot")), "a dot"])
    agent = define_agent(
        name="painter", instructions=".", model=model, tools={"render": render_tool}
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "a dot"
    [block] = results_in(model.requests[1])["r1"]["content"]
    assert block["type"] == "image" and base64.b64decode(block["source"]["data"]) == PNG
    stored = (await outcomes(rt))["r1"].details["output"]
    assert stored == {"png_base64": base64.b64encode(PNG).decode(), "width": 1}
    assert msgspec.json.decode(msgspec.json.encode(stored)) == stored


# -- enabled --------------------------------------------------------------------------


async def test_an_enabled_resolver_is_evaluated_before_every_step(cluster):
    state = {"open": True}
    seen: list[CallInfo] = []

    @tool(id="acme.close/v1", description=".", input=Text, output=Upper)
    async def close(ctx: ToolContext[Text, None]) -> Upper:
        state["open"] = False
        return Upper("closed")

    async def is_open(info: CallInfo) -> bool:
        seen.append(info)
        return state["open"]

    model = ScriptedModel([step(use("c1", "close", text="x")), "closed"])
    agent = define_agent(
        name="door",
        instructions=".",
        model=model,
        tools={"close": Registration(close, enabled=is_open), "upper": upper_tool()},
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go", client_data={"tab": 1}) == "closed"
    assert tool_names(model.requests[0]) == ["close", "upper"]
    assert tool_names(model.requests[1]) == ["upper"]
    assert seen and all(i.entity_url == URL and i.client_data == {"tab": 1} for i in seen)


async def test_a_disabled_tool_called_anyway_gets_an_error_and_does_not_run(cluster):
    executions: list[str] = []
    model = ScriptedModel([step(use("c1", "upper", text="x")), "ok"])
    agent = define_agent(
        name="off",
        instructions=".",
        model=model,
        tools={"upper": Registration(upper_tool(executions), enabled=False)},
    )
    reg = app(agent)
    rt = await cluster.runtime(reg)
    assert await rt.ask(URL, "go") == "ok"
    assert executions == []
    assert tool_names(model.requests[0]) == []
    result = results_in(model.requests[1])["c1"]
    assert result["is_error"] and "disabled" in result["content"][0]["text"]
    [entry] = reg.manifest()["agents"][0]["tools"]
    assert (entry["key"], entry["id"], entry["enabled"]) == ("upper", "acme.upper/v1", False)


# -- context ----------------------------------------------------------------------------


def needs_user(seen: list[Any]) -> Any:
    @tool(id="acme.whoami/v1", description=".", input=Text, output=Upper, context=UserCtx)
    async def whoami(ctx: ToolContext[Text, UserCtx]) -> Upper:
        seen.append(ctx.context)
        return Upper(ctx.context.user_id)

    return whoami


async def test_an_incompatible_context_is_rejected_when_the_agent_is_resolved():
    model = ScriptedModel(["never"])

    def org_only(identity: dict[str, str] | None) -> Count:
        return Count(1)

    with pytest.raises(ToolContractError, match=r"needs context UserCtx.*map_context"):
        define_agent(
            name="bad",
            instructions=".",
            model=model,
            runtime_context=org_only,
            tools={"who": needs_user([])},
        )
    with pytest.raises(ToolContractError, match="runtime context is None"):
        define_agent(name="none", instructions=".", model=model, tools={"who": needs_user([])})
    assert model.requests == []
    agent = define_agent(
        name="mapped",
        instructions=".",
        model=model,
        runtime_context=org_only,
        tools={"who": Registration(needs_user([]), map_context=lambda rc, i, cd: UserCtx("u"))},
    )
    assert agent.manifest()["tools"][0]["map_context"] is True


async def test_map_context_narrows_the_runtime_context(cluster):
    seen: list[Any] = []
    mapped: list[tuple[Any, Any, Any]] = []

    def app_context(identity: dict[str, str] | None) -> AppCtx:
        identity = identity or {}
        return AppCtx(user_id=identity["user"], org_id=identity["org"])

    def narrow(rc: AppCtx, identity: dict[str, str] | None, client_data: Any) -> UserCtx:
        mapped.append((rc, identity, client_data))
        return UserCtx(f"{rc.user_id}@{rc.org_id}")

    model = ScriptedModel([step(use("c1", "who", text="x")), "ok"])
    agent = define_agent(
        name="narrow",
        instructions=".",
        model=model,
        runtime_context=app_context,
        tools={"who": Registration(needs_user(seen), map_context=narrow)},
    )
    rt = await cluster.runtime(app(agent))
    identity = {"user": "u1", "org": "o1"}
    untrusted = {"user": "admin"}
    assert await rt.ask(URL, "go", identity=identity, client_data=untrusted) == "ok"
    assert seen == [UserCtx("u1@o1")] and type(seen[0]) is UserCtx
    assert mapped == [(AppCtx("u1", "o1"), identity, untrusted)]
    assert (await outcomes(rt))["c1"].details == {"output": {"upper": "u1@o1"}}


async def test_the_runtime_context_is_resolved_from_the_messages_identity(cluster):
    seen: list[Any] = []
    identities: list[Any] = []

    def resolve(identity: dict[str, str] | None) -> UserCtx:
        identities.append(identity)
        return UserCtx((identity or {}).get("user", "anon"))

    model = ScriptedModel(
        [step(use("c1", "who", text="x")), "ok", step(use("c2", "who", text="x")), "ok"]
    )
    agent = define_agent(
        name="who",
        instructions=".",
        model=model,
        runtime_context=resolve,
        tools={"who": needs_user(seen)},
    )
    rt = await cluster.runtime(app(agent))
    await rt.send(URL, "go", identity={"user": "alice"}, client_data={"user": "mallory"})
    await rt.wait_idle(URL)
    await rt.send(URL, "again", identity={"user": "bob"})
    await rt.wait_idle(URL)
    assert seen == [UserCtx("alice"), UserCtx("bob")]
    assert {"user": "mallory"} not in identities


# -- on_output and the lifecycle hook -------------------------------------------------


async def test_on_output_gets_the_settled_output_and_its_call(cluster):
    observed: list[OutputInfo] = []

    def resolve(identity: dict[str, str] | None) -> UserCtx:
        return UserCtx((identity or {}).get("user", "anon"))

    model = ScriptedModel([step(use("c1", "up", text="hi"), use("c2", "up", text="yo")), "ok"])
    agent = define_agent(
        name="observed",
        instructions=".",
        model=model,
        runtime_context=resolve,
        tools={"up": Registration(upper_tool(), on_output=observed.append)},
    )
    rt = await cluster.runtime(app(agent))
    await rt.ask(URL, "go", identity={"user": "u1"}, client_data={"page": 2})
    by_call = {o.tool_call_id: o for o in observed}
    assert sorted(by_call) == ["c1", "c2"]  # once per call
    info = by_call["c1"]
    assert info.runtime_context == UserCtx("u1")
    assert info.identity == {"user": "u1"} and info.client_data == {"page": 2}
    assert info.entity_url == URL and info.registration == "up"
    assert info.input == Text("hi") and info.output == Upper("HI")


async def test_on_output_runs_after_the_lifecycle_hook_and_never_for_a_failed_call(cluster):
    order: list[tuple[str, str]] = []

    @tool(id="acme.maybe/v1", description=".", input=Text, output=Upper)
    async def maybe(ctx: ToolContext[Text, None]) -> Upper:
        if ctx.input.text == "fail":
            ctx.fail("failed on purpose")
        return Upper(ctx.input.text.upper())

    def after(outcome: ToolOutcomeInfo) -> None:
        order.append(("after_tool_result", outcome.tool_call_id))

    def on_output(info: OutputInfo) -> None:
        order.append(("on_output", info.tool_call_id))

    model = ScriptedModel(
        [step(use("ok", "maybe", text="a")), step(use("bad", "maybe", text="fail")), "ok"]
    )
    agent = define_agent(
        name="order",
        instructions=".",
        model=model,
        tools={"maybe": Registration(maybe, on_output=on_output)},
        lifecycle=Lifecycle(after_tool_result=after),
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    assert order == [
        ("after_tool_result", "ok"),
        ("on_output", "ok"),
        ("after_tool_result", "bad"),
    ]


async def test_a_raising_on_output_fails_the_run(cluster):
    def on_output(info: OutputInfo) -> None:
        raise ValueError("observer secret")

    model = ScriptedModel([step(use("c1", "up", text="a")), "never"])
    agent = define_agent(
        name="raising",
        instructions=".",
        model=model,
        tools={"up": Registration(upper_tool(), on_output=on_output)},
    )
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    assert failed.value.error == "internal error in tool 'up' (call c1)"
    [bug] = await rt.runtime_errors(URL)
    assert "observer secret" in bug.detail
    assert len(model.requests) == 1


async def test_the_lifecycle_hook_can_turn_errors_into_outputs_and_back(cluster):
    observed: list[str] = []

    @tool(id="acme.maybe/v1", description=".", input=Text, output=Upper)
    async def maybe(ctx: ToolContext[Text, None]) -> Upper:
        if ctx.input.text == "fail":
            ctx.fail("failed on purpose")
        return Upper(ctx.input.text.upper())

    def after(outcome: ToolOutcomeInfo) -> ToolOutcomeInfo:
        if outcome.error is not None:
            return ToolOutcomeInfo(outcome.name, outcome.tool_call_id, output=Upper("RECOVERED"))
        if outcome.output == Upper("SECRET"):
            outcome.output, outcome.error = None, "redacted by policy"
        return outcome

    model = ScriptedModel(
        [step(use("e", "maybe", text="fail"), use("s", "maybe", text="secret")), "ok"]
    )
    agent = define_agent(
        name="hooked",
        instructions=".",
        model=model,
        tools={"maybe": Registration(maybe, on_output=lambda i: observed.append(i.tool_call_id))},
        lifecycle=Lifecycle(after_tool_result=after),
    )
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    results = results_in(model.requests[1])
    assert not results["e"].get("is_error") and "RECOVERED" in results["e"]["content"][0]["text"]
    assert results["s"]["is_error"] and results["s"]["content"][0]["text"] == "redacted by policy"
    assert observed == ["e"]  # the recovered output is observed, the new error is not
    done = await outcomes(rt)
    assert done["e"].details == {"output": {"upper": "RECOVERED"}}
    assert done["s"].details["error"] == "redacted by policy"


# -- capabilities -----------------------------------------------------------------------


class Sandbox:
    def __init__(self, url: str) -> None:
        self.url = url
        self.closed = False


def sandbox_capability(provisioned: list[Sandbox], cleaned: list[Sandbox]) -> Capability[Sandbox]:
    async def provision(url: str) -> Sandbox:
        await asyncio.sleep(0.05)  # concurrent first uses overlap here
        box = Sandbox(url)
        provisioned.append(box)
        return box

    async def cleanup(box: Sandbox) -> None:
        box.closed = True
        cleaned.append(box)

    return Capability("sandbox", provision, cleanup)


def sandbox_agent(model: ScriptedModel, seen: list[Any]) -> AgentDef:
    @tool(id="acme.run/v1", description=".", input=Text, output=Upper, capabilities={"sandbox"})
    async def run(ctx: ToolContext[Text, None]) -> Upper:
        seen.append((ctx.tool_call_id, ctx.capabilities.sandbox))
        return Upper(ctx.capabilities.sandbox.url)

    return define_agent(name="sandboxed", instructions=".", model=model, tools={"run": run})


def two_calls(request: ModelRequest) -> ModelResponse | str:
    if len(request.messages) == 1:
        return step(use("", "run", text="a"), use("", "run", text="b"))
    return "ran"


async def test_a_capability_is_provisioned_once_per_entity_and_cleaned_up_on_delete(cluster):
    provisioned: list[Sandbox] = []
    cleaned: list[Sandbox] = []
    seen: list[Any] = []
    agent = sandbox_agent(ScriptedModel(two_calls), seen)
    rt = await runtime_with(cluster, app(agent), [sandbox_capability(provisioned, cleaned)])
    assert await rt.ask(URL, "go") == "ran"
    assert len(seen) == 2 and seen[0][1] is seen[1][1]  # two concurrent calls, one sandbox
    assert len(provisioned) == 1 and provisioned[0].url == URL
    assert await rt.ask(URL, "again") == "ran"
    assert len(provisioned) == 1  # still the same sandbox for this entity
    assert await rt.ask("/bot/other", "go") == "ran"
    assert [b.url for b in provisioned] == [URL, "/bot/other"]
    assert cleaned == []
    await rt.delete(URL)
    assert cleaned == [provisioned[0]] and provisioned[0].closed


async def test_capabilities_are_cleaned_up_when_the_worker_shuts_down(cluster):
    provisioned: list[Sandbox] = []
    cleaned: list[Sandbox] = []
    agent = sandbox_agent(ScriptedModel(two_calls), [])
    rt = Runtime(
        app(agent),
        settings=cluster.settings(),
        redis=cluster.redis(),
        capabilities=[sandbox_capability(provisioned, cleaned)],
        run_worker=True,
    )
    await rt.start()
    try:
        assert await rt.ask(URL, "go") == "ran"
        assert await rt.ask("/bot/other", "go") == "ran"
        assert cleaned == []
    finally:
        await rt.close()
    assert sorted(b.url for b in cleaned) == ["/bot/b", "/bot/other"]
    assert all(b.closed for b in provisioned)


async def test_a_tool_using_an_unbound_capability_is_rejected_at_resolution(cluster):
    model = ScriptedModel(["never"])
    agent = sandbox_agent(model, [])  # define_agent cannot know the runtime's bindings
    rt = await cluster.runtime(app(agent), max_attempts=1)
    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "go")
    assert "ToolContractError" in (failed.value.error or "")
    assert "['sandbox']" in (failed.value.error or "")
    assert model.requests == []


async def test_after_tool_result_also_sees_the_errors_the_loop_makes(cluster):
    """An unknown tool's error passes through the lifecycle hook, which may turn it into
    an output (and then the model sees the output, not an error)."""
    seen: list[tuple[str, str | None]] = []

    def after(info: ToolOutcomeInfo) -> ToolOutcomeInfo:
        seen.append((info.name, info.error))
        if info.name == "ghost":
            return ToolOutcomeInfo(name=info.name, tool_call_id=info.tool_call_id, output={"ok": 1})
        return info

    model = ScriptedModel(
        [
            ModelResponse(
                content=[{"type": "tool_use", "id": "g1", "name": "ghost", "input": {}}],
                stop_reason="tool_use",
            ),
            "fine",
        ]
    )
    agent = define_agent(
        name="loop-errors",
        instructions="",
        model=model,
        lifecycle=Lifecycle(after_tool_result=after),
    )
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(agent)
        await ctx.agent.run()

    rt = await cluster.runtime(reg)
    assert await rt.ask("/bot/b", "go", timeout=10) == "fine"
    assert seen and seen[0][0] == "ghost" and "Unknown tool 'ghost'" in (seen[0][1] or "")
    result = model.requests[1].messages[-1]["content"][0]
    assert result["tool_use_id"] == "g1" and not result.get("is_error")
    assert result["content"][0]["text"] == '{"ok": 1}'
