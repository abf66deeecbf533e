"""The rules of the tool contract (issue 14): options, async resolvers, structural
contexts, ids of persisted calls, one spec per id, in-doubt calls, collisions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Protocol

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
from tests.faults import crash_and_recover
from wakeful import (
    AgentDef,
    AgentTool,
    HandlerContext,
    Registration,
    Registry,
    RunFailedError,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolContractError,
    cli,
    define_agent,
    define_tool,
    tool,
)
from wakeful.agent_options import OPTION_NAMES
from wakeful.contracts import ApprovalInfo, CallInfo
from wakeful.events import ActionRequested, ToolIntent, ToolOutcome, decode_event

pytestmark = pytest.mark.anyio


def whoami(seen: list[Any], context: Any = UserCtx) -> Any:
    @tool(id="acme.whoami/v1", description=".", input=Text, output=Upper, context=context)
    async def execute(ctx: ToolContext[Text, Any]) -> Upper:
        seen.append(ctx.context)
        return Upper(ctx.context.user_id)

    return execute


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"typo_option": 1}, "unknown option 'typo_option'"),
        ({"temperature": 0.2}, "unknown option 'temperature'"),
        ({"max_step": 3}, "unknown option 'max_step'"),
        ({"max_steps": "3"}, "option 'max_steps': Expected `int`, got `str`"),
        ({"tool_concurrency": 0}, "option 'tool_concurrency': Expected `int` >= 1"),
    ],
)
def test_an_unknown_or_mistyped_option_is_an_error_at_define_agent(
    options: dict[str, Any], named: str
):
    with pytest.raises(ToolContractError, match=f"define_agent\\('a'\\): {named}"):
        define_agent(name="a", instructions=".", model="claude-x", **options)


def test_the_known_options_are_accepted_at_define_agent():
    agent = define_agent(
        name="a", instructions=".", model="m", max_steps=3, max_run_tokens=None, tool_concurrency=2
    )
    assert agent.options == {"max_steps": 3, "max_run_tokens": None, "tool_concurrency": 2}


async def test_an_unknown_option_given_to_use_agent_is_an_error_naming_it(cluster):
    agent = define_agent(name="a", instructions=".", model=ScriptedModel(["hi"]))
    errors: list[Exception] = []
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        for options in ({"max_tokens": 5}, {"max_steps": 2.5}):
            try:
                ctx.use_agent(agent, **options)
            except ToolContractError as exc:
                errors.append(exc)
        ctx.reply("checked")

    rt = await cluster.runtime(reg)
    assert await rt.ask(URL, "go") == "checked"
    assert [str(e) for e in errors] == [
        "use_agent: unknown option 'max_tokens' (the options are " + ", ".join(OPTION_NAMES) + ")",
        "use_agent: option 'max_steps': Expected `int`, got `float` - at `$.max_steps`",
    ]


# -- async resolvers -------------------------------------------------------------------


class AppCtx(msgspec.Struct):
    user_id: str
    org_id: str


async def test_async_resolvers_are_awaited_everywhere(cluster):
    seen: list[Any] = []
    asked: list[ApprovalInfo] = []
    enabled_seen: list[CallInfo] = []

    async def app_context(identity: dict[str, str] | None) -> AppCtx:
        return AppCtx(user_id=(identity or {})["user"], org_id="o1")

    async def narrow(rc: AppCtx, identity: Any, client_data: Any) -> UserCtx:
        return UserCtx(f"{rc.user_id}@{rc.org_id}")

    async def is_enabled(info: CallInfo) -> bool:
        enabled_seen.append(info)
        return isinstance(info.runtime_context, AppCtx)

    async def needs_approval(info: ApprovalInfo) -> bool:
        asked.append(info)
        return info.input.text == "careful"

    model = ScriptedModel(
        [step(use("c1", "who", text="x"), use("c2", "direct", text="careful")), "ok"]
    )
    agent = define_agent(
        name="async",
        instructions=".",
        model=model,
        runtime_context=app_context,
        tools={
            "who": Registration(whoami(seen), map_context=narrow, enabled=is_enabled),
            "direct": Registration(whoami(seen), needs_approval=needs_approval),
        },
    )
    rt = await cluster.runtime(app(agent))
    await rt.send(URL, "go", identity={"user": "u1"})
    await rt.wait_idle(URL)
    [pending] = await rt.pending_actions(URL)
    assert pending.tool_call_id == "c2"
    await rt.approve(URL, "c2", identity={"user": "u1"})
    await rt.wait_idle(URL)
    # map_context's answer for c1; the structural copy of the runtime context for c2
    assert seen == [UserCtx("u1@o1"), UserCtx("u1")]
    assert all(type(s) is UserCtx for s in seen)
    assert enabled_seen and all(isinstance(i.runtime_context, AppCtx) for i in enabled_seen)
    assert [a.tool_call_id for a in asked] == ["c2"]
    assert asked[0].runtime_context == AppCtx("u1", "o1")
    assert (await outcomes(rt))["c1"].details == {"output": {"upper": "u1@o1"}}


# -- structural contexts ---------------------------------------------------------------


class HasUser(Protocol):
    user_id: str


class Scoped(Protocol):
    user_id: str

    def scope(self) -> str: ...


class ScopedUser(msgspec.Struct):
    user_id: str

    def scope(self) -> str:
        return "all"


class WithUserAndMore(msgspec.Struct):  # unrelated to UserCtx, with every field it needs
    org_id: str
    user_id: str
    roles: list[str] = []


@dataclasses.dataclass
class DataUser:
    user_id: str
    extra: int = 0


class WrongType(msgspec.Struct):
    user_id: int


class Missing(msgspec.Struct):
    org_id: str


def agent_with(runtime_context: Any, context: Any, seen: list[Any], model: Any = "m") -> AgentDef:
    return define_agent(
        name="structural",
        instructions=".",
        model=model,
        runtime_context=runtime_context,
        tools={"who": whoami(seen, context)},
    )


def resolver_of(tp: type, **fields: Any) -> Any:
    def resolve(identity: dict[str, str] | None) -> Any:
        return tp(**fields)

    resolve.__annotations__["return"] = tp
    return resolve


@pytest.mark.parametrize(
    ("provided", "fields", "needed", "received"),
    [
        (WithUserAndMore, {"org_id": "o", "user_id": "u"}, UserCtx, UserCtx("u")),
        (DataUser, {"user_id": "u"}, UserCtx, UserCtx("u")),
        (WithUserAndMore, {"org_id": "o", "user_id": "u"}, HasUser, None),
        (DataUser, {"user_id": "u"}, HasUser, None),
        (ScopedUser, {"user_id": "u"}, Scoped, None),
    ],
    ids=[
        "struct-with-more-fields",
        "dataclass",
        "protocol-struct",
        "protocol-dataclass",
        "protocol-with-a-method",
    ],
)
async def test_a_runtime_context_that_provides_the_fields_a_tool_needs_is_accepted(
    cluster, provided: type, fields: dict[str, Any], needed: Any, received: Any
):
    seen: list[Any] = []
    model = ScriptedModel([step(use("c1", "who", text="x")), "ok"])
    agent = agent_with(resolver_of(provided, **fields), needed, seen, model)
    rt = await cluster.runtime(app(agent))
    assert await rt.ask(URL, "go") == "ok"
    expected = received if received is not None else provided(**fields)
    assert seen == [expected] and type(seen[0]) is type(expected)
    assert (await outcomes(rt))["c1"].details == {"output": {"upper": "u"}}


@pytest.mark.parametrize(
    ("provided", "needed", "reason"),
    [
        (WrongType, UserCtx, "its field 'user_id' is int, not str"),
        (Missing, UserCtx, "it has no field 'user_id'"),
        (Missing, HasUser, "it has no field 'user_id'"),
        (WrongType, HasUser, "its field 'user_id' is int, not str"),
        (WithUserAndMore, Scoped, "it has no method 'scope'"),
    ],
)
def test_a_runtime_context_missing_a_field_or_of_the_wrong_type_is_rejected(
    provided: type, needed: Any, reason: str
):
    with pytest.raises(ToolContractError, match=reason):
        agent_with(resolver_of(provided), needed, [])


def test_no_raw_python_error_escapes_define_agent():
    def unresolvable(identity: dict[str, str] | None) -> NoSuchType:  # type: ignore[name-defined]  # noqa: F821
        return None

    with pytest.raises(ToolContractError, match="cannot be resolved"):
        agent_with(unresolvable, UserCtx, [])

    class Odd(msgspec.Struct):
        user: NoSuchType  # type: ignore[name-defined]  # noqa: F821

    for needed in (dict[str, str], Odd):
        with pytest.raises(ToolContractError):
            agent_with(resolver_of(WithUserAndMore), needed, [])

    async def plain(call_id: str, p: Text, signal: Any, on_update: Any) -> str:
        return "x"

    for tools, problem in (
        ([whoami([])], "tools must map keys"),
        ({"who": AgentTool("who", ".", Text, plain)}, "'who' must be define_tool"),
        ({"who": Registration(AgentTool("who", ".", Text, plain))}, "'who' must be define_tool"),
        ({"who are you": whoami([])}, "tool key 'who are you' must be"),
    ):
        with pytest.raises(ToolContractError, match=problem):
            define_agent(name="a", instructions=".", model="m", tools=tools)  # type: ignore[arg-type]


# -- ids of persisted calls ------------------------------------------------------------


async def restart(cluster: Any, old: Runtime, reg: Registry, **overrides: Any) -> Runtime:
    """Stop ``old`` (gracefully) and start a worker with the registry ``reg``."""
    await old.close()
    cluster.runtimes.remove(old)
    return await cluster.runtime(reg, **overrides)


async def test_the_tool_id_is_recorded_with_every_persisted_call(cluster):
    model = ScriptedModel(
        [step(use("c1", "up", text="a")), step(use("c2", "careful", text="b")), "done"]
    )
    agent = define_agent(
        name="ids",
        instructions=".",
        model=model,
        tools={
            "up": upper_tool(),
            "careful": Registration(upper_tool(id="acme.careful/v1"), needs_approval=True),
        },
    )
    rt = await cluster.runtime(app(agent))
    await rt.send(URL, "go")
    await rt.wait_idle(URL)
    [action] = await rt.pending_actions(URL)
    assert (action.tool, action.tool_id) == ("careful", "acme.careful/v1")
    await rt.approve(URL, "c2")
    await rt.wait_idle(URL)
    history = await rt.history(URL)
    intents = {c.id: c.tool_id for e in history if isinstance(e, ToolIntent) for c in e.calls}
    assert intents == {"c1": "acme.upper/v1", "c2": "acme.careful/v1"}
    assert {k: o.tool_id for k, o in (await outcomes(rt)).items()} == intents


def test_events_written_before_tool_ids_are_still_read():
    old = [  # as msgpack in the log; none has a tool_id
        {"t": "tool_intent", "run_id": "r1", "calls": [{"id": "c1", "name": "up", "input": {}}]},
        {
            "t": "tool_result",
            "run_id": "r1",
            "tool_call_id": "c1",
            "name": "up",
            "content": [{"type": "text", "text": "X"}],
        },
        {
            "t": "action_requested",
            "run_id": "r1",
            "tool_call_id": "c2",
            "tool": "up",
            "kind": "approval",
        },
    ]
    intent, result, action = (decode_event(msgspec.msgpack.encode(raw)) for raw in old)
    assert isinstance(intent, ToolIntent) and intent.calls[0].tool_id is None
    assert isinstance(result, ToolOutcome) and result.tool_id is None
    assert isinstance(action, ActionRequested) and action.tool_id is None


@pytest.mark.parametrize("kind", ["approval", "client"])
async def test_a_pending_action_that_meets_another_tool_id_is_failed_naming_both(
    cluster, kind: str
):
    executions: list[str] = []
    observed: list[Any] = []
    model = ScriptedModel([step(use("c1", "up", text="a")), "told"])

    def agent(tool_id: str) -> AgentDef:
        if kind == "approval":
            reg = Registration(upper_tool(executions, id=tool_id), needs_approval=True)
        else:  # no execute: the client answers
            client = define_tool(id=tool_id, description=".", input=Text, output=Upper)
            reg = Registration(client, on_output=observed.append)
        return define_agent(name="ids", instructions=".", model=model, tools={"up": reg})

    first = await cluster.runtime(app(agent("acme.upper/v1")))
    await first.send(URL, "go")
    await first.wait_idle(URL)
    [action] = await first.pending_actions(URL)
    assert (action.kind, action.tool_id) == (kind, "acme.upper/v1")
    second = await restart(cluster, first, app(agent("acme.upper/v2")))
    if kind == "approval":
        await second.approve(URL, "c1")
    else:
        await second.submit_tool_result(URL, "c1", {"upper": "A"})
    await second.wait_idle(URL)
    assert executions == [] and observed == []  # never taken by the new contract
    text = results_in(model.requests[1])["c1"]["content"][0]["text"]
    assert "'acme.upper/v1'" in text and "'acme.upper/v2'" in text
    assert (await outcomes(second))["c1"].is_error


class Blocking:
    """A typed tool whose first call blocks until its worker stops it."""

    def __init__(self, tool_id: str = "acme.blocking/v1", **options: Any) -> None:
        self.executions: list[str] = []
        self.started = asyncio.Event()
        self.tool = define_tool(
            id=tool_id,
            description=".",
            input=Text,
            output=Upper,
            execute=self.execute,
            **options,
        )

    async def execute(self, ctx: ToolContext[Text, None]) -> Upper:
        self.executions.append(ctx.tool_call_id)
        if len(self.executions) == 1:
            self.started.set()
            await asyncio.Event().wait()  # until the worker stops (cancels) the call
        return Upper(ctx.input.text.upper())


async def stop_mid_call(
    cluster: Any, first_agent: AgentDef, started: asyncio.Event, then: AgentDef
) -> Runtime:
    """Run ``first_agent`` until its tool call started, stop that worker gracefully (the
    call is then in doubt: intent, no result), and finish on a worker with ``then``."""
    first = await cluster.runtime(app(first_agent), shutdown_grace_s=0)
    await first.send(URL, "go")
    await asyncio.wait_for(started.wait(), 15)
    second = await restart(cluster, first, app(then))
    assert (await second.wait_idle(URL, timeout=20)).status == "idle"
    return second


def blocking_agent(model: Any, tool: Any, name: str = "doubt") -> AgentDef:
    return define_agent(name=name, instructions=".", model=model, tools={"slow": tool})


async def test_an_in_doubt_typed_call_is_not_run_again_and_the_model_is_told(cluster):
    blocking = Blocking()
    model = ScriptedModel([step(use("c1", "slow", text="a")), "told"])
    agent = blocking_agent(model, blocking.tool)
    rt = await stop_mid_call(cluster, agent, blocking.started, agent)
    assert blocking.executions == ["c1"]
    outcome = (await outcomes(rt))["c1"]
    assert outcome.is_error and "was interrupted" in outcome.content[0]["text"]
    assert "was interrupted" in results_in(model.requests[-1])["c1"]["content"][0]["text"]
    assert agent.manifest()["tools"][0]["rerun_in_doubt"] is False


async def test_a_typed_call_whose_result_a_crash_lost_is_not_run_again(cluster):
    executions: list[str] = []
    model = ScriptedModel([step(use("c1", "up", text="a")), "told"])
    agent = define_agent(
        name="crash", instructions=".", model=model, tools={"up": upper_tool(executions)}
    )
    # Commits: 1 the step with the user turn and its intent, 2 the result: die before 2.
    rt = await crash_and_recover(cluster, app(agent), URL, "go", "flush:before-commit", 2)
    assert executions == ["c1"]
    outcome = (await outcomes(rt))["c1"]
    assert outcome.is_error and "was interrupted" in outcome.content[0]["text"]


@pytest.mark.parametrize("where", ["tool", "registration"])
async def test_a_typed_call_that_opts_in_runs_again_with_the_same_id(cluster, where: str):
    blocking = Blocking(**({"rerun_in_doubt": True} if where == "tool" else {}))
    tool_or_reg = (
        blocking.tool if where == "tool" else Registration(blocking.tool, rerun_in_doubt=True)
    )
    model = ScriptedModel([step(use("c1", "slow", text="a")), "done"])
    agent = blocking_agent(model, tool_or_reg)
    rt = await stop_mid_call(cluster, agent, blocking.started, agent)
    assert blocking.executions == ["c1", "c1"]
    assert (await outcomes(rt))["c1"].details == {"output": {"upper": "A"}}
    assert agent.manifest()["tools"][0]["rerun_in_doubt"] is True


async def test_an_in_doubt_call_that_meets_another_tool_id_is_refused_naming_both(cluster):
    first = Blocking("acme.slow/v1", rerun_in_doubt=True)
    then = Blocking("acme.slow/v2", rerun_in_doubt=True)
    model = ScriptedModel([step(use("c1", "slow", text="a")), "told"])
    rt = await stop_mid_call(
        cluster,
        blocking_agent(model, first.tool),
        first.started,
        blocking_agent(model, then.tool),
    )
    assert (first.executions, then.executions) == (["c1"], [])
    text = (await outcomes(rt))["c1"].content[0]["text"]
    assert "'acme.slow/v1'" in text and "'acme.slow/v2'" in text


# -- one id, one contract --------------------------------------------------------------


class Other(msgspec.Struct):
    other: int


def test_one_id_with_two_input_or_output_schemas_is_rejected_at_define_agent():
    async def execute(ctx: ToolContext[Any, None]) -> Any:
        return None

    same_id = {"id": "acme.upper/v1", "description": ".", "execute": execute}
    other_input = define_tool(input=Other, output=Upper, **same_id)
    other_output = define_tool(input=Text, output=Other, **same_id)
    for changed, part in ((other_input, "input schema"), (other_output, "output schema")):
        with pytest.raises(ToolContractError, match=f"'acme.upper/v1' has two different {part}s"):
            define_agent(
                name="a", instructions=".", model="m", tools={"up": upper_tool(), "x": changed}
            )
    # across the agents of one registry
    reg = Registry()
    reg.agent(define_agent(name="a", instructions=".", model="m", tools={"up": upper_tool()}))
    with pytest.raises(ToolContractError, match=r"agent 'a', key 'up'.*agent 'b', key 'x'"):
        reg.agent(define_agent(name="b", instructions=".", model="m", tools={"x": other_input}))
    assert [a["name"] for a in reg.manifest()["agents"]] == ["a"]


async def test_one_id_with_two_schemas_is_rejected_at_use_agent(cluster):
    errors: list[Exception] = []
    model = ScriptedModel(["never"])
    agent = define_agent(name="a", instructions=".", model=model, tools={"up": upper_tool()})
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        async def other(call_id: str, p: Other, signal: Any, on_update: Any) -> str:
            return "x"

        extra = AgentTool("shout", ".", Other, other, id="acme.upper/v1")
        try:
            ctx.use_agent(agent, tools=[extra])
        except ToolContractError as exc:
            errors.append(exc)
        ctx.reply("checked")

    rt = await cluster.runtime(reg)
    assert await rt.ask(URL, "go") == "checked"
    [error] = errors
    assert "'acme.upper/v1'" in str(error) and "input schema" in str(error)


# -- client tools: names and ids -------------------------------------------------------


LOCATION = {
    "name": "getLocation",
    "description": "Where the user is",
    "input_schema": {"type": "object", "properties": {}},
}


async def test_a_client_tool_colliding_with_a_backend_tool_id_fails_the_run(cluster):
    executions: list[str] = []
    model = ScriptedModel(["never"])
    backend = upper_tool(executions, id="client:getLocation")
    agent = define_agent(name="c", instructions=".", model=model, tools={"locate": backend})
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError, match=r"'client:getLocation'.*backend tool 'locate'"):
        await rt.ask(URL, "where am I?", client_tools=[LOCATION], timeout=10)
    assert model.requests == []


async def test_a_backend_tool_whose_id_starts_with_client_is_not_replaced_by_name(cluster):
    model = ScriptedModel(["never"])
    backend = upper_tool(id="client:getLocation")
    agent = define_agent(name="c", instructions=".", model=model, tools={"getLocation": backend})
    rt = await cluster.runtime(app(agent))
    with pytest.raises(RunFailedError, match="collides with a backend tool"):
        await rt.ask(URL, "where am I?", client_tools=[LOCATION], timeout=10)
    assert model.requests == []


# -- the manifest ----------------------------------------------------------------------

MANIFEST_APP = """
import msgspec
from wakeful import Registration, Registry, define_agent, define_tool

class Text(msgspec.Struct):
    text: str

class Upper(msgspec.Struct):
    upper: str

async def execute(ctx):
    return Upper(ctx.input.text.upper())

upper = define_tool(id="acme.upper/v1", description=".", input=Text, output=Upper,
                    execute=execute)
registry = Registry()
registry.agent(define_agent(name="shouter", instructions=".", model="claude-x", tools={
    "upper": upper, "again": Registration(upper, rerun_in_doubt=True)}))
"""


def test_wakeful_manifest_shows_ids_keys_schemas_and_rerun_in_doubt(
    tmp_path: Any, monkeypatch: Any, capsys: Any
):
    (tmp_path / "toolids_manifest_app.py").write_text(MANIFEST_APP)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["manifest", "toolids_manifest_app"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    [agent] = manifest["agents"]
    shown = [(t["key"], t["id"], t["rerun_in_doubt"]) for t in agent["tools"]]
    assert shown == [("upper", "acme.upper/v1", False), ("again", "acme.upper/v1", True)]
    assert agent["tools"][0]["input_schema"]["properties"] == {"text": {"type": "string"}}
    assert agent["tools"][0]["output_schema"]["properties"] == {"upper": {"type": "string"}}
    runtime = {t["key"]: t for t in manifest["runtime_tools"]}
    assert runtime["spawn_agent"]["id"] == "wakeful.runtime.spawn_agent/v1"
    assert runtime["spawn_agent"]["rerun_in_doubt"] is True
    assert runtime["spawn_agent"]["input_schema"]["required"] == ["agent", "task"]
    assert "dispatch" not in runtime
