"""The seed example: the calculator and memory tools, and the assistant that delegates."""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec
import pytest

from tests.faults import crash_and_recover
from wakeful import (
    Collection,
    Created,
    HandlerContext,
    Message,
    Registry,
    RunFinished,
    UnknownCollectionError,
)
from wakeful.context import CancelSignal
from wakeful.entities import registry as entities_registry
from wakeful.entities.assistant import assistant_step, demo_model, pick_model
from wakeful.events import AssistantStep, ToolOutcome
from wakeful.models import DEFAULT_MODEL, ModelRequest, ScriptedModel
from wakeful.tools import MEMORY_COLLECTION, calculator, memory_store
from wakeful.tools.calculator import MAX_INT_BITS, Calculation, CalculationError, evaluate

pytestmark = pytest.mark.anyio

ASSISTANT = "/assistant/a"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entities pick Claude when a key is set; these tests use the scripted models."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


async def _events(rt: Any, url: str, kind: type) -> list[Any]:
    return [r.event async for r in rt.events(url) if isinstance(getattr(r, "event", None), kind)]


def _text(outcome: ToolOutcome) -> str:
    return "".join(b.get("text", "") for b in outcome.content)


# -- calculator ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 ** 3 ** 2", 512),  # right-associative
        ("-2 ** 2", -4),  # ** binds tighter than unary minus
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("+3 - -2", 5),
        ("2 ** -1", 0.5),
        ("1.5e3 + 1", 1501.0),
        ("sqrt(16) + abs(-2.5)", 6.5),
        ("round(2.567, 2)", 2.57),
        ("round(7.5)", 8),
        ("min(3, 1, 2) + max(4, 9)", 10),
        ("log(e)", 1.0),
        ("log(8, 2)", 3.0),
        ("sin(0) + cos(0)", 1.0),
        ("cos(pi)", -1.0),
        ("1" + " + 1" * 120, 121),  # a long flat chain is not "deep"
        ("2 ** 4000", 2**4000),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("3 // (2 - 2)", "division by zero"),
        ("x + 1", "name 'x' is not allowed"),
        ("__builtins__", "name '__builtins__' is not allowed"),
        ("math.pi", "attribute access is not allowed"),
        ("(1).__class__", "attribute access is not allowed"),
        ("__import__('os').system('echo hacked')", "not allowed"),
        ("open('/etc/passwd')", "function 'open' is not allowed"),
        ("eval('1 + 1')", "function 'eval' is not allowed"),
        ("(lambda: 1)()", "only calls of"),
        ("min(x=1)", "no keyword arguments"),
        ("sqrt(1, 2)", "sqrt() takes 1 argument, got 2"),
        ("'a' * 3", "strings are not allowed"),
        ("True + 1", "bool values are not allowed"),
        ("1 < 2", "a comparison is not allowed"),
        ("not 1", "is not allowed"),
        ("[1, 2]", "a list is not allowed"),
        ("1, 2", "a tuple is not allowed"),
        ("x[0]", "not allowed"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 100000", "too large"),
        (f"2 ** {MAX_INT_BITS + 1}", "too large"),
        ("10 ** 1000 * 10 ** 1000", "too large"),
        ("2.0 ** 100000", "too large"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "complex"),
        ("sqrt(-1)", "sqrt(-1) is undefined"),
        ("log(0)", "log(0) is undefined"),
        ("round(5, -1000000)", "round() digits"),
        ("-" * 150 + "1", "nested"),
        ("(" * 220 + "1" + ")" * 220, "nested"),
        ("1 +", "invalid syntax"),
        ("1" * 600, "the limit is 500"),
        ("   ", "empty"),
    ],
)
def test_calculator_refuses_with_a_clear_error(expression: str, problem: str) -> None:
    started = time.monotonic()
    with pytest.raises(CalculationError) as caught:
        evaluate(expression)
    assert problem in str(caught.value)
    assert time.monotonic() - started < 1  # refused before any huge computation


async def test_calculator_tool_returns_results_and_error_results() -> None:
    def nothing(update: Any) -> None:
        pass

    ok = await calculator.execute("c1", Calculation("(3 + 4) * 6"), CancelSignal(), nothing)
    assert (ok.content, ok.is_error, ok.details["value"]) == ("(3 + 4) * 6 = 42", False, 42)
    bad = await calculator.execute("c2", Calculation("1 / 0"), CancelSignal(), nothing)
    assert bad.is_error and "division by zero" in bad.content
    named = await calculator.execute("c3", Calculation("y * 2"), CancelSignal(), nothing)
    assert named.is_error and "name 'y' is not allowed" in named.content
    assert calculator.spec()["input_schema"]["required"] == ["expression"]


# -- memory -------------------------------------------------------------------------


def memory_call(action: str, key: str | None = None, value: str | None = None) -> Any:
    args: dict[str, Any] = {"action": action}
    if key is not None:
        args["key"] = key
    if value is not None:
        args["value"] = value
    return ScriptedModel.tool_calls(("memory", args))


def keeper_app(model: ScriptedModel) -> Registry:
    reg = Registry()

    @reg.entity("keeper", state={"kv": MEMORY_COLLECTION})
    async def keeper(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="You remember.", model=model, tools=[memory_store(ctx)])
        await ctx.agent.run()

    return reg


async def test_memory_tool_sets_gets_lists_and_deletes_through_a_run(cluster):
    calls = [
        ("set", "colour", "teal", False, "Remembered 'colour'."),
        ("set", "city", "Lisbon", False, "Remembered 'city'."),
        ("set", "colour", "green", False, "Updated 'colour' (it was 'teal')."),
        ("get", "colour", None, False, "colour: green"),
        ("get", "pet", None, False, "Nothing is remembered under 'pet'."),
        ("list", None, None, False, "2 remembered:\n- colour: green\n- city: Lisbon"),
        ("delete", "city", None, False, "Forgot 'city'."),
        ("delete", "city", None, False, "Nothing was remembered under 'city'; nothing to delete."),
        ("set", "colour", None, True, "Invalid memory call: set needs key and value."),
        ("set", None, "blue", True, "Invalid memory call: set needs key and value."),
        ("get", None, None, True, "Invalid memory call: get needs key."),
        ("delete", "  ", None, True, "Invalid memory call: delete needs key."),
        ("get", "colour", "x", True, "Invalid memory call: get takes no value (only set does)."),
        (
            "list",
            "colour",
            None,
            True,
            "Invalid memory call: list takes no key (it shows every key).",
        ),
    ]
    model = ScriptedModel([memory_call(a, k, v) for a, k, v, _, _ in calls] + ["All done."])
    rt = await cluster.runtime(keeper_app(model))
    assert await rt.ask("/keeper/k", "remember things", timeout=20) == "All done."

    outcomes = await _events(rt, "/keeper/k", ToolOutcome)
    assert [(o.is_error, _text(o)) for o in outcomes] == [(e, text) for *_, e, text in calls]
    assert await rt.state("/keeper/k") == {"kv": [{"key": "colour", "value": "green"}]}


async def test_memory_tool_refuses_an_unknown_action(cluster):
    """An unknown action never reaches the tool: the arguments fail validation."""
    model = ScriptedModel([memory_call("wipe"), "ok"])
    rt = await cluster.runtime(keeper_app(model))
    assert await rt.ask("/keeper/k", "wipe it", timeout=20) == "ok"
    [outcome] = await _events(rt, "/keeper/k", ToolOutcome)
    assert outcome.is_error and "Invalid arguments for memory" in _text(outcome)
    assert "wipe" in _text(outcome)
    assert await rt.state("/keeper/k") == {"kv": []}


async def test_memory_store_names_a_missing_collection(cluster):
    reg = Registry()
    errors: list[str] = []

    @reg.entity("forgetful", state={"other": Collection()})
    async def forgetful(ctx: HandlerContext) -> None:
        try:
            memory_store(ctx)
        except UnknownCollectionError as exc:
            errors.append(str(exc))

    rt = await cluster.runtime(reg)
    await rt.send("/forgetful/f", "hi")
    await rt.wait_idle("/forgetful/f")
    assert errors == ["no collection named 'kv' (collections: other)"]


def test_memory_parameters_schema_lists_the_actions() -> None:
    from wakeful.tools.memory import MemoryRequest

    schema = msgspec.json.schema(MemoryRequest)
    props = schema["$defs"]["MemoryRequest"]["properties"]
    assert sorted(props["action"]["enum"]) == ["delete", "get", "list", "set"]


# -- the assistant and its researcher -------------------------------------------------


def test_pick_model_uses_claude_only_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(pick_model(), ScriptedModel)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert pick_model() == DEFAULT_MODEL == "claude-sonnet-4-6"


def test_demo_model_answers_a_researchers_result_with_its_findings() -> None:
    note = "[/researcher/r1 finished its run]\nFindings: 6 * 7 = 42."
    request = ModelRequest(
        model="scripted",
        system="s",
        messages=[{"role": "user", "content": [{"type": "text", "text": note}]}],
    )
    response = assistant_step(request)
    assert response.stop_reason == "end_turn"
    assert response.content[0]["text"] == "The researcher reports back: Findings: 6 * 7 = 42."
    assert demo_model().name == "scripted-assistant"


async def _dispatch_ids(rt: Any, url: str) -> list[str]:
    steps = await _events(rt, url, AssistantStep)
    return [
        b["id"]
        for s in steps
        for b in s.content
        if b.get("type") == "tool_use" and b["name"] == "spawn_agent"
    ]


async def _dispatched_children(rt: Any, url: str) -> list[str]:
    """The child urls the dispatch tool reported (its result details)."""
    return [
        o.details["child"] for o in await _events(rt, url, ToolOutcome) if o.name == "spawn_agent"
    ]


DERIVED_CHILD = re.compile(r"/researcher/researcher-[0-9a-f]{16}")


async def test_assistant_delegates_to_a_researcher_and_answers_with_its_findings(cluster):
    rt = await cluster.runtime(entities_registry)
    answer = await rt.ask(ASSISTANT, "Please research what 6 * 7 is.", timeout=30)
    assert (
        answer
        == "The researcher reports back: Findings: 6 * 7 = 42 (computed with the calculator)."
    )

    [child] = await rt.children(ASSISTANT)
    assert await _dispatched_children(rt, ASSISTANT) == [child.url]
    assert DERIVED_CHILD.fullmatch(child.url)  # derived from the wake and the call, no clock
    assert (child.status, child.pending) == ("completed", False)
    assert child.response is not None and "6 * 7 = 42" in child.response
    status = await rt.status(child.url)
    assert (status.type, status.parent, status.status) == ("researcher", ASSISTANT, "idle")
    [child_run] = await _events(rt, child.url, RunFinished)
    assert (child_run.status, child_run.response) == ("completed", child.response)
    assert [o.name for o in await _events(rt, child.url, ToolOutcome)] == ["calculator"]

    # The parent's first run ended after dispatching; the child's result woke it for a second.
    first, second = await _events(rt, ASSISTANT, RunFinished)
    assert first.status == "completed" and "asked a researcher" in (first.response or "")
    assert (second.status, second.response) == ("completed", answer)
    assert "42" in answer
    parent = await rt.status(ASSISTANT)
    assert (parent.status, parent.awaited_children) == ("idle", 0)


async def test_assistant_remembers_across_runs_and_restarts(cluster):
    rt = await cluster.runtime(entities_registry)
    await rt.ask(ASSISTANT, "Remember that my favourite colour is teal.", timeout=20)
    assert await rt.state(ASSISTANT) == {"kv": [{"key": "favourite colour", "value": "teal"}]}
    await rt.close()
    cluster.runtimes.remove(rt)
    fresh = await cluster.runtime(entities_registry)  # a new worker rebuilds from the log
    answer = await fresh.ask(ASSISTANT, "What is my favourite colour?", timeout=20)
    assert answer == "Your favourite colour is teal."


async def test_two_runs_dispatch_two_distinct_children(cluster):
    rt = await cluster.runtime(entities_registry)
    first = await rt.ask(ASSISTANT, "Research what 6 * 7 is.", timeout=30)
    second = await rt.ask(ASSISTANT, "Research what 5 * 5 is.", timeout=30)
    assert "6 * 7 = 42" in first and "5 * 5 = 25" in second
    ids = await _dispatch_ids(rt, ASSISTANT)
    assert len(set(ids)) == 2
    children = await rt.children(ASSISTANT)
    assert sorted(c.url for c in children) == sorted(await _dispatched_children(rt, ASSISTANT))
    assert all(c.status == "completed" for c in children)
    assert len(await rt.list("researcher")) == 2


async def test_a_tool_call_id_reused_in_a_later_run_still_dispatches_a_new_child(cluster):
    """Child ids and effect keys derive from the wake as well as the call id, so a model
    that reuses ids (a scripted one does) cannot make a later dispatch a silent duplicate.
    A replay of the same call is covered by the crash tests below."""
    reg = Registry()
    call = ScriptedModel.tool_calls(
        ("spawn_agent", {"agent": "researcher", "task": "Work out 2 + 2."})
    )
    call.content[0]["id"] = "toolu_same"
    model = ScriptedModel(
        [call, "Dispatched.", "Answered.", call, "Dispatched again.", "Answered again."]
    )

    @reg.entity("boss")
    async def boss(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="You delegate.", model=model, tools=ctx.runtime_tools)
        await ctx.agent.run()

    reg.register("researcher", entities_registry.get("researcher").handler)
    rt = await cluster.runtime(reg)
    assert await rt.ask("/boss/b", "delegate", timeout=20) == "Answered."
    assert await rt.ask("/boss/b", "delegate again", timeout=20) == "Answered again."
    children = await _dispatched_children(rt, "/boss/b")
    assert len(set(children)) == 2
    assert sorted(await rt.list("researcher")) == sorted(children)
    for child in children:
        child_log = [r.event async for r in rt.events(child)]
        assert len([e for e in child_log if isinstance(e, Created)]) == 1
        assert len([e for e in child_log if isinstance(e, Message)]) == 1


# The research run's commits: 1 the dispatch step with the user turn and its intent, 2
# its result (with the spawn in the outbox), then the spawn is delivered.
CRASH_POINTS = [
    ("flush:before-commit", 2),  # the call is in doubt: the dispatch runs again, same id
    ("flush:after-commit", 2),  # result committed, spawn not yet delivered
    ("deliver:after-spawn", 1),  # spawn delivered, delivery not yet marked
]


@pytest.mark.parametrize(("point", "hit"), CRASH_POINTS, ids=[f"{p}#{n}" for p, n in CRASH_POINTS])
async def test_a_crash_around_the_dispatch_spawns_one_child(cluster, point: str, hit: int):
    second = await crash_and_recover(
        cluster, entities_registry, ASSISTANT, "Research what 6 * 7 is.", point, hit
    )
    [child] = await _dispatched_children(second, ASSISTANT)
    assert await second.list("researcher") == [child]
    child_log = [r.event async for r in second.events(child)]
    assert len([e for e in child_log if isinstance(e, Created)]) == 1
    assert len([e for e in child_log if isinstance(e, Message)]) == 1
    runs = await _events(second, ASSISTANT, RunFinished)
    assert runs[-1].status == "completed" and "6 * 7 = 42" in (runs[-1].response or "")
    assert (
        len([o for o in await _events(second, ASSISTANT, ToolOutcome) if o.name == "spawn_agent"])
        == 1
    )


async def test_the_assistant_asks_before_losing_a_fact(cluster):
    """Adding a fact needs no approval; replacing or forgetting one waits for a person."""
    from wakeful.errors import RunSuspendedError

    rt = await cluster.runtime(entities_registry)
    await rt.ask(ASSISTANT, "remember that my color is teal")
    assert await rt.pending_actions(ASSISTANT) == []
    await rt.ask(ASSISTANT, "remember that my color is teal")  # the same value: nothing lost
    with pytest.raises(RunSuspendedError):
        await rt.ask(ASSISTANT, "remember that my color is blue")
    [change] = await rt.pending_actions(ASSISTANT)
    assert change.kind == "approval" and change.input["value"] == "blue"
    await rt.deny(ASSISTANT, change.tool_call_id, "keep teal")
    await rt.wait_idle(ASSISTANT)
    assert (await rt.state(ASSISTANT))["kv"] == [{"key": "color", "value": "teal"}]
    with pytest.raises(RunSuspendedError):
        await rt.ask(ASSISTANT, "forget my color")
    [forget] = await rt.pending_actions(ASSISTANT)
    await rt.approve(ASSISTANT, forget.tool_call_id)
    await rt.wait_idle(ASSISTANT)
    assert (await rt.state(ASSISTANT))["kv"] == []
    # Forgetting what was never remembered loses nothing: no approval.
    assert "Nothing was remembered" in await rt.ask(ASSISTANT, "forget my shoe size")
