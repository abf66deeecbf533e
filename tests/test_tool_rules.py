"""The rules of the tool contract (issue 14): options, async resolvers, structural
contexts, ids of persisted calls, one spec per id, in-doubt calls, collisions."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import msgspec
import pytest

from wakeful import (
    AgentDef,
    HandlerContext,
    Registration,
    Registry,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolContractError,
    define_agent,
    tool,
)
from wakeful.contracts import ApprovalInfo, CallInfo
from wakeful.events import ToolOutcome
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio

URL = "/bot/b"


class Text(msgspec.Struct):
    text: str


class Upper(msgspec.Struct):
    upper: str


class UserCtx(msgspec.Struct):
    user_id: str


def use(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def step(*calls: dict[str, Any]) -> ModelResponse:
    return ModelResponse(content=list(calls), stop_reason="tool_use")


def results_in(request: ModelRequest) -> dict[str, dict[str, Any]]:
    return {b["tool_use_id"]: b for b in request.messages[-1]["content"]}


def app(agent: AgentDef, **use_options: Any) -> Registry:
    reg = Registry()
    reg.agent(agent)

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent(agent, **use_options)
        await ctx.agent.run()

    return reg


async def outcomes(rt: Runtime, url: str = URL) -> dict[str, ToolOutcome]:
    return {e.tool_call_id: e for e in await rt.history(url) if isinstance(e, ToolOutcome)}


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
        "use_agent: unknown option 'max_tokens' (the options are max_steps, max_run_tokens, "
        "max_output_tokens, tool_concurrency)",
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
    ],
    ids=["struct-with-more-fields", "dataclass", "protocol-struct", "protocol-dataclass"],
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
