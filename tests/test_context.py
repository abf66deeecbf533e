"""Context management of the agent loop, through the real anthropic SDK: a fake
Messages API with a small context window (``WindowedAPI``) that refuses a request
past it with the API's own ``400 prompt is too long``, counts tokens on
``/v1/messages/count_tokens`` and checks every request the way the API does
(alternation, tool_use/tool_result pairs)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import anthropic
import httpx2
import msgspec
import pytest

from tests.anthropic_fakes import MODEL, error_response, ok, stream_body, text_block, tool_block
from tests.faults import crash_and_recover
from wakeful import AgentTool, HandlerContext, Registry, ToolResult
from wakeful.compaction import SUMMARY_SYSTEM
from wakeful.errors import RunFailedError
from wakeful.events import ConversationCompacted, RunFailedNote, UserTurn
from wakeful.models import AnthropicModel

pytestmark = pytest.mark.anyio

WINDOW = 3000  # tokens, as the fake API counts them: 4 bytes of JSON each
FILLER = "lorem ipsum dolor sit amet " * 12  # ~80 tokens of message


class WindowedAPI:
    """A Messages API with a ``WINDOW``-token context: counts, refuses, answers."""

    def __init__(self, *, tool_every_turn: bool = False, window: int = WINDOW) -> None:
        self.window = window
        self.tool_every_turn = tool_every_turn
        self.sent: list[dict[str, Any]] = []  # bodies of /v1/messages requests
        self.answers: list[int] = []  # HTTP status of each
        self.counted = 0
        self.summaries = 0

    @staticmethod
    def tokens(body: dict[str, Any]) -> int:
        sized = {k: body.get(k) for k in ("system", "messages", "tools")}
        return len(json.dumps(sized)) // 4

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/count_tokens"):
            self.counted += 1
            return httpx2.Response(200, json={"input_tokens": self.tokens(body)})
        self.sent.append(body)
        size = self.tokens(body)
        problem = check_request(body)
        if problem:
            self.answers.append(400)
            return error_response(400, "invalid_request_error", problem)
        if size + body["max_tokens"] > self.window:
            self.answers.append(400)
            return error_response(
                400,
                "invalid_request_error",
                f"prompt is too long: {size} tokens > {self.window - body['max_tokens']} maximum",
            )
        self.answers.append(200)
        system = body.get("system") or [{"text": ""}]
        if system[0]["text"] == SUMMARY_SYSTEM:
            self.summaries += 1
            return ok(self._text(f"SUMMARY-{self.summaries} of the talk so far.", size))
        last = body["messages"][-1]
        if self.tool_every_turn and not any(
            b.get("type") == "tool_result" for b in last["content"]
        ):
            n = len(self.sent)
            return ok(
                stream_body(
                    tool_block(0, f"toolu_{n}", "echo", json.dumps({"text": "x" * 40})),
                    stop_reason="tool_use",
                    input_tokens=size,
                )
            )
        return ok(self._text("Noted. " + "ok " * 20, size))

    @staticmethod
    def _text(text: str, size: int) -> bytes:
        return stream_body(text_block(0, text), stop_reason="end_turn", input_tokens=size)

    def client(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key="test",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)),
            max_retries=0,
        )


def check_request(body: dict[str, Any]) -> str:
    """What the API would refuse in ``body``'s messages, or ''."""
    messages = body["messages"]
    if not messages or messages[0]["role"] != "user":
        return "messages: first message must use the user role"
    for i, (a, b) in enumerate(itertools.pairwise(messages)):
        if a["role"] == b["role"]:
            return f"messages.{i + 1}: roles must alternate"
    for i, message in enumerate(messages):
        uses = [x["id"] for x in message["content"] if x.get("type") == "tool_use"]
        following = messages[i + 1]["content"] if i + 1 < len(messages) else []
        results = [x["tool_use_id"] for x in following if x.get("type") == "tool_result"]
        if uses and results[: len(uses)] != uses:
            return f"messages.{i}: tool_use ids {uses} without tool_result blocks after them"
        if message["role"] == "user" and i > 0:
            before = {x["id"] for x in messages[i - 1]["content"] if x.get("type") == "tool_use"}
            mine = [x["tool_use_id"] for x in message["content"] if x.get("type") == "tool_result"]
            if any(r not in before for r in mine):
                return f"messages.{i}: unexpected tool_use_id in tool_result blocks"
    return ""


class Echo(msgspec.Struct):
    text: str


def chat_app(
    api: WindowedAPI,
    *,
    reset_after_run: bool = False,
    live: dict[str, Any] | None = None,
    **options: Any,
) -> Registry:
    """A chat agent on ``api``; ``live`` options are read at each wake (a test changes them)."""
    client = api.client()
    reg = Registry()

    @reg.entity("chat")
    async def chat(ctx: HandlerContext) -> None:
        async def echo(call_id: str, p: Echo, signal: Any, on_update: Any) -> ToolResult:
            return ToolResult(p.text)

        ctx.use_agent(
            system_prompt="You chat.",
            model=AnthropicModel(MODEL, client=client),
            tools=[AgentTool("echo", "Echoes its text.", Echo, echo)],
            max_output_tokens=200,
            **options,
            **(live or {}),
        )
        for record in ctx.wake.events:
            text = getattr(record.event, "payload", None)
            if text == "/compact":
                await ctx.compact_conversation()
                return
            if text == "/reset":
                await ctx.reset_conversation()
                return
        await ctx.agent.run()
        if reset_after_run:
            await ctx.reset_conversation()

    return reg


async def log_events(rt: Any, url: str, kind: type) -> list[Any]:
    return [r.event async for r in rt.events(url) if isinstance(getattr(r, "event", None), kind)]


async def test_a_context_overflow_compacts_and_retries_once(cluster):
    # The agent believes it has a big window; the API refuses at 3,000 tokens.
    api = WindowedAPI()
    rt = await cluster.runtime(chat_app(api, context_window=200_000))
    url = "/chat/overflow"
    for n in range(40):
        assert (await rt.ask(url, f"turn {n}: {FILLER}", timeout=60)).startswith("Noted.")
    assert 400 in api.answers  # the window was really passed
    compactions = await log_events(rt, url, ConversationCompacted)
    assert compactions and all(c.reason == "prompt too long" for c in compactions)
    for i, status in enumerate(api.answers):
        if status == 400:  # each refusal: one summary, then the same step again, accepted
            assert api.answers[i + 1 : i + 3] == [200, 200]
            assert api.sent[i + 1]["system"][0]["text"] == SUMMARY_SYSTEM
    # The conversation now starts from the summary; every user turn is still in the log.
    conversation = await rt.conversation(url)
    assert conversation[0]["content"][0]["text"].startswith("[Summary of the earlier conversation]")
    turns = await log_events(rt, url, UserTurn)
    assert len(turns) == 40


async def test_a_long_conversation_crosses_the_budget_twice_without_a_refusal(cluster):
    api = WindowedAPI()
    rt = await cluster.runtime(chat_app(api, context_window=WINDOW))
    url = "/chat/long"
    for n in range(45):
        await rt.ask(url, f"turn {n}: {FILLER}", timeout=60)
    compactions = await log_events(rt, url, ConversationCompacted)
    assert len(compactions) >= 2
    assert {c.reason for c in compactions} == {"budget"}
    assert 400 not in api.answers
    assert api.counted > 0  # near the budget the API counted
    # The second summary was made from the first (an earlier summary is kept).
    summaries = [b for b in api.sent if b["system"][0]["text"] == SUMMARY_SYSTEM]
    assert "SUMMARY-1" in json.dumps(summaries[1]["messages"])
    assert compactions[1].turns > compactions[0].turns


async def test_trimming_drops_whole_turns_and_keeps_tool_pairs_valid(cluster):
    api = WindowedAPI(tool_every_turn=True)
    rt = await cluster.runtime(chat_app(api, context_window=WINDOW, context_strategy="trim"))
    url = "/chat/trim"
    for n in range(30):
        await rt.ask(url, f"turn {n}: {FILLER}", timeout=60)
    trims = await log_events(rt, url, ConversationCompacted)
    assert trims and {t.mode for t in trims} == {"trim"}
    assert api.summaries == 0
    assert set(api.answers) == {200}  # every request valid, none too long
    conversation = await rt.conversation(url)
    assert check_request({"messages": conversation}) == ""
    assert "earlier turns were dropped" in conversation[0]["content"][0]["text"]


async def test_a_failed_run_does_not_pile_onto_the_next_message(cluster):
    api = WindowedAPI()
    calls = {"n": 0}
    real = api.handler

    def refuse_first(request: httpx2.Request) -> httpx2.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return error_response(400, "invalid_request_error", "messages: something is off")
        return real(request)

    api.handler = refuse_first  # type: ignore[method-assign]
    rt = await cluster.runtime(chat_app(api))
    url = "/chat/failed"
    with pytest.raises(RunFailedError, match="something is off"):
        await rt.ask(url, "first", timeout=30)
    assert (await rt.ask(url, "second", timeout=30)).startswith("Noted.")
    notes = await log_events(rt, url, RunFailedNote)
    assert len(notes) == 1
    messages = api.sent[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"][0]["text"] == "first"
    assert "the run failed" in messages[1]["content"][0]["text"]
    assert messages[2]["content"][0]["text"] == "second"


async def test_compact_and_reset_on_demand_from_the_handler(cluster):
    api = WindowedAPI()
    rt = await cluster.runtime(chat_app(api))
    url = "/chat/handler"
    for n in range(4):
        await rt.ask(url, f"turn {n}", timeout=30)
    await rt.send(url, "/compact")
    await rt.wait_idle(url)
    (compacted,) = await log_events(rt, url, ConversationCompacted)
    assert compacted.mode == "compact" and compacted.summary == "SUMMARY-1 of the talk so far."
    conversation = await rt.conversation(url)
    assert conversation[0]["content"][0]["text"].endswith("SUMMARY-1 of the talk so far.")
    assert "turn 3" in json.dumps(conversation)  # the last turns stay as they were
    await rt.send(url, "/reset")
    await rt.wait_idle(url)
    assert await rt.conversation(url) == []
    assert (await rt.ask(url, "fresh start", timeout=30)).startswith("Noted.")
    assert (
        api.sent[-1]["messages"]
        == [{"role": "user", "content": [{"type": "text", "text": "fresh start"}]}]
        or api.sent[-1]["messages"][0]["content"][0]["text"] == "fresh start"
    )
    assert len(api.sent[-1]["messages"]) == 1


async def test_compact_and_reset_on_demand_from_the_client(cluster):
    api = WindowedAPI()
    rt = await cluster.runtime(chat_app(api))
    url = "/chat/client"
    for n in range(4):
        await rt.ask(url, f"turn {n}", timeout=30)
    assert await rt.compact(url) is True
    assert api.summaries == 1
    history = await rt.history(url)
    assert isinstance(history[0], ConversationCompacted) and history[0].request
    # Done once: the input is not answered again by later wakes.
    await rt.ask(url, "after", timeout=30)
    assert api.summaries == 1
    assert await rt.reset_conversation(url) is True
    assert await rt.conversation(url) == []
    assert await rt.reset_conversation(url) is False  # nothing left to drop


async def test_a_wake_replayed_after_a_reset_does_not_take_its_message_again(cluster):
    # The handler runs the agent, then resets; the worker dies right after the reset
    # commits. The replayed wake must not find its message "fresh" (its turn is gone).
    api = WindowedAPI()
    app = chat_app(api, reset_after_run=True)
    # The wake's one commit point before its own: the reset, with the user turn, the step
    # and the run's end.
    rt = await crash_and_recover(cluster, app, "/chat/taken", "one", "flush:after-commit", 1)
    assert len(api.sent) == 1  # one model call: the message was not taken twice
    assert await rt.conversation("/chat/taken") == []
    assert len(await log_events(rt, "/chat/taken", UserTurn)) == 1


@pytest.mark.parametrize("point", ["flush:before-commit", "flush:after-commit"])
async def test_a_crash_during_compaction_loses_nothing(cluster, point):
    api = WindowedAPI()
    live = {"context_window": 200_000}
    app = chat_app(api, live=live)
    url = "/chat/crash"

    async def setup(rt: Any) -> None:
        # Turns past the budget of a 3,000-token window (still inside the API's own)...
        n = 0
        while not api.sent or WindowedAPI.tokens(api.sent[-1]) < 2300:
            await rt.ask(url, f"turn {n}: {FILLER}", timeout=60)
            n += 1
        assert not await log_events(rt, url, ConversationCompacted)
        live["context_window"] = WINDOW  # ...then the agent learns its window: it compacts

    # The new message's first commit point is the compaction (with its user turn).
    rt = await crash_and_recover(cluster, app, url, f"last: {FILLER}", point, 1, setup=setup)
    compactions = await log_events(rt, url, ConversationCompacted)
    assert len(compactions) == 1  # committed once, whichever side of the commit it died on
    history = await rt.history(url)
    assert history[0] == compactions[0]
    turns = await log_events(rt, url, UserTurn)
    assert turns[-1].content[0]["text"].startswith("last:")
    # Everything the summary replaced is still in the log; the run finished answered.
    replaced_turns = compactions[0].turns
    assert replaced_turns + sum(isinstance(e, UserTurn) for e in history) == len(turns)
    assert (await rt.status(url, runs=True)).last_run.status == "completed"
    assert api.summaries == (2 if point == "flush:before-commit" else 1)


def test_bad_context_options_are_named():
    from wakeful.context_window import ContextPolicy
    from wakeful.errors import ContextConfigError

    with pytest.raises(ContextConfigError, match="context_strategy"):
        ContextPolicy.build(MODEL, context_strategy="squeeze")
    with pytest.raises(ContextConfigError, match="context_window"):
        ContextPolicy.build(MODEL, context_window=10)
    with pytest.raises(ContextConfigError, match="context_budget"):
        ContextPolicy.build(MODEL, context_budget=2)
    assert ContextPolicy.build(MODEL).window == 200_000
    assert ContextPolicy.build("scripted").window is None


async def test_each_step_projects_only_what_it_adds(cluster, monkeypatch):
    # A warm entity's projection is kept between steps and wakes: a run takes in its
    # own events, not the conversation again.
    from wakeful.history import Projection

    taken: list[int] = []
    real = Projection._take

    def counting(self: Projection, event: Any) -> None:
        taken.append(1)
        real(self, event)

    monkeypatch.setattr(Projection, "_take", counting)
    api = WindowedAPI(tool_every_turn=True)
    rt = await cluster.runtime(chat_app(api, context_window=200_000))
    url = "/chat/flat"
    costs = []
    for n in range(12):
        del taken[:]
        await rt.ask(url, f"turn {n}", timeout=30)
        costs.append(len(taken))
    # A run: its user turn, the tool step, the intent, the result, the text step.
    assert costs[2:] == [5] * 10, costs


async def test_scripted_model_requests_share_the_messages_they_resend(cluster):
    from wakeful import ScriptedModel

    model = ScriptedModel(lambda request: "ok")
    reg = Registry()

    @reg.entity("chat")
    async def chat(ctx: HandlerContext) -> None:
        ctx.use_agent("You chat.", model)
        await ctx.agent.run()

    rt = await cluster.runtime(reg)
    for text in ("one", "two", "three"):
        await rt.ask("/chat/shared", text)
    first, _, third = model.requests
    assert third.messages[0] is first.messages[0]  # not copied
    assert [m["content"][0]["text"] for m in third.messages[::2]] == ["one", "two", "three"]
