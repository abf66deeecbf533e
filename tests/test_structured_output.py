"""Structured output (issue 15): ``output_type=SomeStruct`` makes a run's result a
validated value, through the real anthropic SDK with a mocked HTTP transport: valid
at once, corrected after an invalid answer, failed after the limit, a turn that ends
in text, and the value carried to a parent in ``run_finished``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypedDict

import msgspec
import pytest

from tests.agent_apps import events_of
from tests.anthropic_fakes import Server, ok, stream_body, text_block, tool_block
from tests.faults import crash_and_recover
from wakeful import (
    AgentTool,
    HandlerContext,
    Registry,
    RunFailedError,
    RunFinished,
    ScriptedModel,
    ToolContractError,
    ToolResult,
    Wake,
    define_agent,
)
from wakeful.events import ChildRunFinished, ToolOutcome, UserTurn
from wakeful.models import ModelResponse

pytestmark = pytest.mark.anyio

URL = "/judge/j"


class Verdict(msgspec.Struct):
    winner: str
    score: int = msgspec.field(default=0)
    reasons: list[str] = []


def answer(call_id: str, value: Any, *, text: str | None = None) -> bytes:
    blocks = [text_block(0, text)] if text else []
    blocks.append(tool_block(len(blocks), call_id, "final_answer", json.dumps(value)))
    return stream_body(*blocks, stop_reason="tool_use")


def judge_app(model: Any, results: list[Any] | None = None, **options: Any) -> Registry:
    reg = Registry()
    agent = define_agent(
        name="judge", instructions="You judge.", model=model, output_type=Verdict, **options
    )

    @reg.entity("judge")
    async def judge(ctx: HandlerContext) -> None:
        ctx.use_agent(agent)
        result = await ctx.agent.run()
        if results is not None:
            results.append(result)

    return reg


async def test_a_valid_answer_is_the_runs_output_on_the_first_try(cluster):
    value = {"winner": "blue", "score": 7, "reasons": ["faster"]}
    server = Server(ok(answer("toolu_a1", value, text="Blue wins.")))
    results: list[Any] = []
    rt = await cluster.runtime(judge_app(server.model(), results))

    reply = await rt.ask(URL, "Who wins?")

    assert json.loads(reply) == value
    [body] = [server.body(0)]  # one request: the answer ends the run, no extra turn
    assert len(server.requests) == 1
    final = body["tools"][-1]
    assert final["name"] == "final_answer"
    assert final["input_schema"]["required"] == ["winner"]
    assert final["input_schema"]["properties"]["score"] == {"type": "integer", "default": 0}
    assert body["tool_choice"] == {"type": "any"}
    [result] = results
    assert result.status == "completed"
    assert result.output == Verdict("blue", 7, ["faster"])
    assert result.output_type == "Verdict"
    [finished] = await events_of(rt, URL, RunFinished)
    assert (finished.output, finished.output_type) == (value, "Verdict")
    # The answer's call is settled in the journal, so the next turn's request is valid.
    [outcome] = await events_of(rt, URL, ToolOutcome)
    assert (outcome.tool_call_id, outcome.is_error) == ("toolu_a1", False)


async def test_an_invalid_answer_goes_back_to_the_model_to_correct(cluster):
    server = Server(
        ok(answer("toolu_b1", {"winner": "blue", "score": "high"})),
        ok(answer("toolu_b2", {"winner": "blue", "score": 9})),
    )
    results: list[Any] = []
    rt = await cluster.runtime(judge_app(server.model(), results))

    assert json.loads(await rt.ask(URL, "Who wins?")) == {
        "winner": "blue",
        "score": 9,
        "reasons": [],
    }

    second = server.body(1)["messages"]
    [result_block] = second[-1]["content"]
    assert result_block["type"] == "tool_result" and result_block["is_error"] is True
    assert result_block["tool_use_id"] == "toolu_b1"
    error = result_block["content"][0]["text"]
    assert "does not match Verdict: Expected `int`, got `str` - at `$.score`" in error
    assert "Call final_answer again" in error
    assert results[0].output == Verdict("blue", 9)


async def test_the_run_fails_after_the_limit_and_the_entity_goes_on(cluster):
    bad = {"score": 1}  # no winner
    server = Server(
        ok(answer("toolu_c1", bad)),
        ok(answer("toolu_c2", bad)),
        ok(answer("toolu_c3", {"winner": "red"})),
    )
    rt = await cluster.runtime(judge_app(server.model(), output_retries=1))

    with pytest.raises(RunFailedError) as failed:
        await rt.ask(URL, "Who wins?")

    assert failed.value.error == (
        "the answer did not validate as Verdict after 2 attempts: the answer does not "
        "match Verdict: Object missing required field `winner`"
    )
    assert len(server.requests) == 2  # no third try for that run
    [finished] = await events_of(rt, URL, RunFinished)
    assert (finished.status, finished.output, finished.output_type) == ("failed", None, None)
    # The next message is a run of its own, and its request is valid (every call answered).
    assert json.loads(await rt.ask(URL, "And now?"))["winner"] == "red"
    last = server.body(2)["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]


async def test_a_turn_that_ends_in_text_is_taken_as_json_or_asked_again(cluster):
    server = Server(
        ok(stream_body(text_block(0, "Blue, clearly."), stop_reason="end_turn")),
        ok(stream_body(text_block(0, '```json\n{"winner": "blue"}\n```'), stop_reason="end_turn")),
    )
    thinking = {"type": "enabled", "budget_tokens": 1024}
    rt = await cluster.runtime(judge_app(server.model(), thinking=thinking))

    assert json.loads(await rt.ask(URL, "Who wins?"))["winner"] == "blue"

    assert "tool_choice" not in server.body(0)  # thinking on: no forced tool call
    nudge = server.body(1)["messages"][-1]["content"][-1]["text"]
    assert nudge.startswith("[the turn ended without calling final_answer.")
    turns = await events_of(rt, URL, UserTurn)
    assert [t.sources == [] for t in turns] == [False, True]


async def test_the_output_reaches_a_parent_in_run_finished(cluster):
    seen: list[ChildRunFinished] = []
    model = ScriptedModel([ScriptedModel.tool_calls(("final_answer", {"winner": "green"}))])
    reg = judge_app(model)

    @reg.entity("boss")
    async def boss(ctx: HandlerContext) -> None:
        for message in ctx.wake.messages:
            ctx.record_run()
            await ctx.spawn(
                "judge",
                "j1",
                initial_message=message.payload,
                wake=Wake.run_finished(include_response=True),
            )
        for finished in ctx.wake.runs_finished:
            seen.append(finished)
            ctx.reply(f"{finished.output_type}: {finished.output['winner']}")

    rt = await cluster.runtime(reg)
    assert await rt.ask("/boss/b", "Who wins?") == "Verdict: green"
    [finished] = seen
    assert finished.output == {"winner": "green", "score": 0, "reasons": []}
    assert finished.output_type == "Verdict"


async def test_an_agent_parent_reads_the_childs_answer_with_its_type(cluster):
    child_model = ScriptedModel([ScriptedModel.tool_calls(("final_answer", {"winner": "x"}))])
    parent_model = ScriptedModel(
        [ScriptedModel.tool_calls(("spawn_agent", {"agent": "judge", "task": "go"})), "1", "2"]
    )
    reg = judge_app(child_model)

    @reg.entity("lead")
    async def lead(ctx: HandlerContext) -> None:
        ctx.use_agent("You delegate.", parent_model, tools=[*ctx.runtime_tools])
        await ctx.agent.run()

    rt = await cluster.runtime(reg)
    await rt.ask("/lead/l", "judge it")
    await rt.wait_all_idle()
    texts = [
        block.get("text", "")
        for request in parent_model.requests
        for message in request.messages
        for block in message["content"]
        if isinstance(block, dict)
    ]
    assert any("finished its run with a Verdict" in t and '"winner": "x"' in t for t in texts), (
        texts
    )


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Pair(TypedDict):
    left: str
    right: str


@pytest.mark.parametrize(
    ("output_type", "given", "expected"),
    [
        (Point, {"x": 1, "y": 2}, Point(1, 2)),
        (Pair, {"left": "a", "right": "b"}, {"left": "a", "right": "b"}),
    ],
)
async def test_a_dataclass_or_a_typed_dict_is_an_output_type(
    cluster, output_type: type, given: dict[str, Any], expected: Any
):
    model = ScriptedModel([ScriptedModel.tool_calls(("final_answer", given))])
    results: list[Any] = []
    reg = Registry()

    @reg.entity("judge")
    async def judge(ctx: HandlerContext) -> None:
        ctx.use_agent("You answer.", model, output_type=output_type)
        results.append(await ctx.agent.run())

    rt = await cluster.runtime(reg)
    assert json.loads(await rt.ask(URL, "go")) == given
    assert results[0].output == expected
    assert results[0].output_type == output_type.__name__
    assert model.requests[0].tool_choice == {"type": "any"}


async def noop(call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
    return ToolResult("ok")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"output_type": int}, "option 'output_type': <class 'int'> is not a msgspec Struct"),
        ({"output_type": "Verdict"}, "option 'output_type': 'Verdict' is not a msgspec Struct"),
        (
            {"output_type": Verdict, "output_format": {"type": "json_schema", "schema": {}}},
            "options 'output_type' and 'output_format' both shape the answer",
        ),
        ({"output_type": Verdict, "tool_choice": "none"}, "option 'tool_choice': 'none' leaves"),
        ({"output_type": Verdict, "output_retries": -1}, "option 'output_retries': Expected"),
    ],
)
def test_a_bad_output_option_is_named_at_define_agent(options: dict[str, Any], named: str):
    with pytest.raises(ToolContractError, match=f"define_agent\\('a'\\): {named}"):
        define_agent(name="a", instructions=".", model="claude-x", **options)


def test_a_forced_final_answer_is_accepted_as_tool_choice():
    agent = define_agent(
        name="a",
        instructions=".",
        model="claude-x",
        output_type=Verdict,
        tool_choice={"type": "tool", "name": "final_answer"},
    )
    assert agent.options["output_type"] is Verdict


async def test_a_tool_named_final_answer_is_refused_at_use_agent(cluster):
    errors: list[str] = []
    reg = Registry()

    @reg.entity("judge")
    async def judge(ctx: HandlerContext) -> None:
        try:
            ctx.use_agent(
                "x",
                ScriptedModel(["hi"]),
                tools=[AgentTool("final_answer", "mine", {"type": "object"}, noop)],
                output_type=Verdict,
            )
        except ToolContractError as exc:
            errors.append(str(exc))
        ctx.reply("checked")

    rt = await cluster.runtime(reg)
    assert await rt.ask(URL, "go") == "checked"
    assert errors and "a tool is named 'final_answer'" in errors[0]


def test_model_response_is_exported():
    import wakeful

    assert wakeful.ModelResponse is ModelResponse


async def test_a_crash_after_any_commit_of_the_run_resumes_to_the_same_answer(cluster):
    """Every decision about the answer is made from journaled events: a worker killed
    after any commit of a run with one correction resumes to the same output, and
    never asks the model for a step it journaled."""
    # Commits: step 1 with the user turn and its intent, its (invalid) result, step 2 with
    # its intent, its result; then the run's end with the wake's own commit.
    crashes = [("flush:after-commit", hit) for hit in range(1, 5)] + [("wake:after-commit", 1)]
    for point, hit in crashes:
        model = ScriptedModel(
            [
                ScriptedModel.tool_calls(("final_answer", {"winner": 3})),
                ScriptedModel.tool_calls(("final_answer", {"winner": "blue"})),
            ]
        )
        url = f"/judge/crash-{point.replace(':', '-')}-{hit}"
        rt = await crash_and_recover(cluster, judge_app(model), url, "Who wins?", point, hit)
        finished = await events_of(rt, url, RunFinished)
        assert [(f.status, f.output, f.output_type) for f in finished] == [
            ("completed", {"winner": "blue", "score": 0, "reasons": []}, "Verdict")
        ], f"crash at {point} {hit}"
        assert len(model.requests) == 2, f"crash at {point} {hit}: a step was asked again"
        await rt.close()
        cluster.runtimes.remove(rt)


def test_the_manifest_shows_the_answers_type_and_the_server_tools():
    agent = define_agent(
        name="a",
        instructions=".",
        model="claude-x",
        output_type=Verdict,
        server_tools=[{"type": "web_search_20250305"}],
    )
    manifest = agent.manifest()
    assert manifest["output"]["type"] == "Verdict"
    assert manifest["output"]["schema"]["required"] == ["winner"]
    assert manifest["server_tools"] == [{"name": "web_search", "type": "web_search_20250305"}]
    assert define_agent(name="b", instructions=".", model="claude-x").manifest()["output"] is None


async def test_a_paused_turn_is_continued_and_a_refusal_fails_the_run(cluster):
    paused = ModelResponse(
        content=[{"type": "text", "text": "Searching..."}], stop_reason="pause_turn"
    )
    model = ScriptedModel(
        [
            paused,
            ScriptedModel.tool_calls(("final_answer", {"winner": "blue"})),
            ModelResponse(content=[{"type": "text", "text": ""}], stop_reason="refusal"),
        ]
    )
    rt = await cluster.runtime(judge_app(model))

    assert json.loads(await rt.ask(URL, "Who wins?"))["winner"] == "blue"
    assert len(model.requests) == 2  # the paused turn went on, without a correction
    assert await events_of(rt, URL, UserTurn) != [] and all(
        t.sources for t in await events_of(rt, URL, UserTurn)
    )
    with pytest.raises(RunFailedError, match="the model refused to answer"):
        await rt.ask(URL, "And now?")
    assert len(model.requests) == 3  # a refusal is not asked again
