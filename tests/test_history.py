"""``project(history)`` always yields a request the Messages API accepts.

The journal can hold anything the runtime (or a crash in the middle of it) may
leave behind: tool calls without results, results for calls that are no longer
open or never were, duplicated results, reused tool-use ids, intents anywhere,
blank text. ``validate`` checks the rules the API enforces on ``messages``; the
property test feeds it random journals, the example tests pin the important cases.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from wakeful.events import AssistantStep, HistoryEvent, ToolCall, ToolIntent, ToolOutcome, UserTurn
from wakeful.history import INTERRUPTED, project

RUN = "r1"
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


# --- the API's rules ------------------------------------------------------------------


def _blank(block: dict[str, Any]) -> bool:
    text = block.get("text")
    return not isinstance(text, str) or not text.strip()


def validate(messages: list[dict[str, Any]]) -> None:
    """Raise AssertionError unless ``messages`` is a valid Messages API ``messages`` list.

    * a non-empty list that starts with a user message; roles alternate;
    * every message has a non-empty list of content blocks, none a blank text block;
    * tool_use blocks only in assistant messages, each with an id of the API's pattern
      that no other tool_use of the request has;
    * an assistant message with tool_use blocks is followed by a user message whose
      content starts with one tool_result per call, in call order, and has no other
      tool_result; tool_result blocks appear nowhere else;
    * a tool_result's content is a non-empty list of non-blank text blocks.
    """
    assert isinstance(messages, list) and messages, "messages must be a non-empty list"
    assert messages[0]["role"] == "user", "the first message must be a user message"
    used: set[str] = set()
    expected: list[str] = []  # tool_use ids the current message must answer first
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        role, content = message["role"], message["content"]
        assert set(message) == {"role", "content"}, f"{where}: unexpected keys {set(message)}"
        assert role in ("user", "assistant"), f"{where}: role {role!r}"
        if i:
            assert role != messages[i - 1]["role"], f"{where}: two {role} messages in a row"
        assert isinstance(content, list) and content, f"{where}: empty content"
        for j, block in enumerate(content):
            assert isinstance(block, dict) and "type" in block, f"{where}.content.{j}: no type"
            if block["type"] == "text":
                assert not _blank(block), f"{where}.content.{j}: blank text block"
        results = [b for b in content if b["type"] == "tool_result"]
        calls = [b for b in content if b["type"] == "tool_use"]
        if role == "user":
            assert not calls, f"{where}: tool_use in a user message"
            lead = content[: len(expected)]
            answered = [b.get("tool_use_id") for b in lead if b["type"] == "tool_result"]
            assert answered == expected, (
                f"{where}: must start with results for {expected}, starts with {answered}"
            )
            assert len(results) == len(expected), f"{where}: tool_result outside the answers"
            for block in results:
                body = block["content"]
                assert isinstance(body, list) and body, f"{where}: empty tool_result content"
                for part in body:
                    assert part.get("type") == "text", f"{where}: tool_result content not text"
                    assert not _blank(part), f"{where}: blank text in a tool_result"
                assert isinstance(block.get("is_error", False), bool)
            expected = []
        else:
            assert not expected, f"{where}: calls {expected} were not answered"
            assert not results, f"{where}: tool_result in an assistant message"
            for block in calls:
                call_id = block.get("id")
                assert isinstance(call_id, str) and TOOL_USE_ID.match(call_id), (
                    f"{where}: bad tool_use id {call_id!r}"
                )
                assert call_id not in used, f"{where}: tool_use id {call_id!r} is not unique"
                used.add(call_id)
            expected = [b["id"] for b in calls]
    assert not expected, f"the last message has unanswered calls {expected}"


# --- journals -------------------------------------------------------------------------

# A small pool makes reused ids (within a step, across steps, results for the wrong
# step) common; the pattern makes ids the API has never seen.
ids = st.sampled_from(["toolu_a", "toolu_b", "toolu_c", "toolu_a_1"]) | st.from_regex(
    r"toolu_[a-z0-9]{1,3}", fullmatch=True
)
texts = st.sampled_from(["", " ", "\n", " \t\n "]) | st.text(
    alphabet="ab \n", min_size=1, max_size=6
)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str = "f") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {"x": 1}}


def user(*blocks: str) -> UserTurn:
    return UserTurn(run_id=RUN, content=[text(b) for b in blocks])


def step(*content: dict[str, Any] | str) -> AssistantStep:
    blocks = [text(b) if isinstance(b, str) else b for b in content]
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return AssistantStep(run_id=RUN, step=1, content=blocks, stop_reason=stop)


def outcome(call_id: str, *blocks: str, is_error: bool = False) -> ToolOutcome:
    return ToolOutcome(
        run_id=RUN,
        tool_call_id=call_id,
        name="f",
        content=[text(b) for b in blocks],
        is_error=is_error,
    )


def intent(*call_ids: str) -> ToolIntent:
    return ToolIntent(run_id=RUN, calls=[ToolCall(id=c, name="f") for c in call_ids])


@st.composite
def journals(draw: st.DrawFn) -> list[HistoryEvent]:
    events: list[HistoryEvent] = []
    open_ids: list[str] = []  # the calls of the last assistant step
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "results", "intent", "stray"]))
        if kind == "user":
            events.append(user(*draw(st.lists(texts, max_size=3))))
        elif kind == "assistant":
            call_ids = draw(st.lists(ids, max_size=3))
            blocks: list[dict[str, Any]] = [tool_use(c) for c in call_ids]
            for value in draw(st.lists(texts, max_size=2)):
                blocks.insert(draw(st.integers(0, len(blocks))), text(value))
            events.append(step(*blocks))
            open_ids = call_ids
        elif kind == "results":
            # Some, all or none of the open calls, in any order, some twice, plus strays.
            answered = draw(st.permutations(open_ids))[: draw(st.integers(0, len(open_ids)))]
            answered += draw(st.lists(st.sampled_from(open_ids), max_size=2)) if open_ids else []
            answered += draw(st.lists(ids, max_size=2))
            for call_id in draw(st.permutations(answered)):
                body = draw(st.lists(texts, max_size=2))
                events.append(outcome(call_id, *body, is_error=draw(st.booleans())))
        elif kind == "intent":
            known = st.sampled_from(open_ids) | ids if open_ids else ids
            events.append(intent(*draw(st.lists(known, max_size=3))))
        else:  # a result for a call nobody made
            events.append(outcome(draw(ids), draw(texts)))
    return events


def _texts(messages: list[dict[str, Any]], role: str) -> list[str]:
    return [
        b["text"]
        for m in messages
        if m["role"] == role
        for b in m["content"]
        if b["type"] == "text" and not b["text"].startswith("(")
    ]


@settings(max_examples=1000, deadline=None)
@given(journals())
def test_the_projection_of_any_journal_is_a_valid_request(journal: list[HistoryEvent]) -> None:
    messages = project(journal)

    if not any(isinstance(e, UserTurn | AssistantStep) for e in journal):
        assert messages == []  # nothing to send (the runtime never calls the model then)
        return
    validate(messages)
    # Nothing the model or the user said is lost, and every call is shown.
    said = [
        b["text"]
        for e in journal
        if isinstance(e, UserTurn)
        for b in e.content
        if b["text"].strip()
    ]
    assert _texts(messages, "user") == said
    answered = [
        b["text"]
        for e in journal
        if isinstance(e, AssistantStep)
        for b in e.content
        if b["type"] == "text" and b["text"].strip()
    ]
    assert _texts(messages, "assistant") == answered
    calls = sum(
        1
        for e in journal
        if isinstance(e, AssistantStep)
        for b in e.content
        if b["type"] == "tool_use"
    )
    assert calls == sum(1 for m in messages for b in m["content"] if b["type"] == "tool_use")
    # The journal is left alone.
    assert project(journal) == messages


def test_validate_rejects_what_the_api_rejects() -> None:
    ok = [
        {"role": "user", "content": [text("hi")]},
        {"role": "assistant", "content": [tool_use("t1")]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [text("1")]},
                text("more"),
            ],
        },
    ]
    validate(ok)
    bad = {
        "empty": [],
        "assistant first": ok[1:],
        "blank text": [{"role": "user", "content": [text(" ")]}],
        "empty content": [{"role": "user", "content": []}],
        "same role twice": [ok[0], ok[0]],
        "dangling call": ok[:2],
        "text before results": [ok[0], ok[1], {"role": "user", "content": ok[2]["content"][::-1]}],
        "reused id": [*ok, ok[1], ok[2]],
        "stray result": [
            {"role": "user", "content": [ok[2]["content"][0]]},
        ],
        "empty result": [
            ok[0],
            ok[1],
            {"role": "user", "content": [{**ok[2]["content"][0], "content": []}]},
        ],
    }
    for name, messages in bad.items():
        try:
            validate(messages)
        except AssertionError:
            continue
        raise AssertionError(f"validate accepted {name}")


# --- examples -------------------------------------------------------------------------


def result(call_id: str, body: str, is_error: bool = False) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": call_id, "content": [text(body)]}
    if is_error:
        block["is_error"] = True
    return block


def test_results_go_back_in_call_order() -> None:
    journal = [
        user("add"),
        step("Adding.", tool_use("t1"), tool_use("t2")),
        intent("t1", "t2"),
        outcome("t2", "9"),
        outcome("t1", "5"),
        step("5 and 9."),
    ]
    assert project(journal) == [
        {"role": "user", "content": [text("add")]},
        {"role": "assistant", "content": [text("Adding."), tool_use("t1"), tool_use("t2")]},
        {"role": "user", "content": [result("t1", "5"), result("t2", "9")]},
        {"role": "assistant", "content": [text("5 and 9.")]},
    ]


def test_an_interrupted_call_gets_an_error_result() -> None:
    journal = [
        user("go"),
        step(tool_use("t1"), tool_use("t2")),
        intent("t1", "t2"),
        outcome("t2", "ok"),
    ]
    messages = project(journal)
    validate(messages)
    assert messages[-1] == {
        "role": "user",
        "content": [result("t1", INTERRUPTED, is_error=True), result("t2", "ok")],
    }


def test_a_result_for_an_unknown_id_is_dropped() -> None:
    journal = [
        user("go"),
        outcome("ghost", "boo"),
        step(tool_use("t1")),
        outcome("t9", "x"),
        outcome("t1", "1"),
    ]
    messages = project(journal)
    validate(messages)
    assert messages[0] == {"role": "user", "content": [text("go")]}
    assert messages[-1] == {"role": "user", "content": [result("t1", "1")]}
    assert "ghost" not in str(messages) and "t9" not in str(messages)


def test_a_user_turn_while_calls_are_open_follows_their_results() -> None:
    """A message that arrives while a run waits for a client tool must not hide the
    result submitted later: the result comes first, then the message."""
    journal = [user("go"), step(tool_use("t1")), user("stop"), outcome("t1", "late")]
    messages = project(journal)
    validate(messages)
    assert messages[-1]["content"] == [result("t1", "late"), text("stop")]


def test_a_result_after_its_call_was_settled_is_dropped() -> None:
    journal = [user("go"), step(tool_use("t1")), step("Done."), outcome("t1", "late")]
    messages = project(journal)
    validate(messages)
    assert messages[2]["content"] == [result("t1", INTERRUPTED, is_error=True)]
    assert "late" not in str(messages)


def test_a_duplicated_result_is_sent_once() -> None:
    journal = [user("go"), step(tool_use("t1")), outcome("t1", "first"), outcome("t1", "again")]
    messages = project(journal)
    validate(messages)
    assert messages[-1]["content"] == [result("t1", "again")]


def test_two_assistant_steps_in_a_row() -> None:
    # Text-only steps merge into one assistant message.
    merged = project([user("hi"), step("One."), step("Two.")])
    assert merged == [
        {"role": "user", "content": [text("hi")]},
        {"role": "assistant", "content": [text("One."), text("Two.")]},
    ]
    # A step's unanswered calls are settled before the next step.
    messages = project([user("hi"), step(tool_use("t1")), step("Done.")])
    validate(messages)
    assert messages[1:] == [
        {"role": "assistant", "content": [tool_use("t1")]},
        {"role": "user", "content": [result("t1", INTERRUPTED, is_error=True)]},
        {"role": "assistant", "content": [text("Done.")]},
    ]


def test_a_user_turn_after_dangling_calls_comes_after_their_results() -> None:
    messages = project([user("hi"), step("Hm.", tool_use("t1"), tool_use("t2")), user("well?")])
    validate(messages)
    assert messages[-1] == {
        "role": "user",
        "content": [
            result("t1", INTERRUPTED, is_error=True),
            result("t2", INTERRUPTED, is_error=True),
            text("well?"),
        ],
    }


def test_dangling_calls_at_the_end_are_answered() -> None:
    messages = project([user("hi"), step(tool_use("t1"))])
    validate(messages)
    assert messages[-1] == {"role": "user", "content": [result("t1", INTERRUPTED, is_error=True)]}


def test_an_assistant_step_first_gets_a_user_message_before_it() -> None:
    messages = project([step("Hello."), user("hi")])
    validate(messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]


def test_blank_text_is_dropped_and_empty_content_gets_a_placeholder() -> None:
    messages = project(
        [
            user("hi", "  "),
            step(" ", tool_use("t1"), "\n"),
            outcome("t1", " "),
            user(" \n"),
            step(""),
        ]
    )
    validate(messages)
    assert messages[0]["content"] == [text("hi")]
    assert messages[1]["content"] == [tool_use("t1")]
    tool_result, placeholder = messages[2]["content"]
    assert tool_result["tool_use_id"] == "t1" and tool_result["content"][0]["text"].strip()
    assert placeholder["text"].strip()
    assert messages[3]["content"][0]["text"].strip()


def test_a_reused_tool_use_id_is_renamed_in_the_request() -> None:
    journal = [
        user("go"),
        step(tool_use("t1"), tool_use("t1")),
        outcome("t1", "one"),
        step(tool_use("t1")),
        outcome("t1", "two"),
    ]
    messages = project(journal)
    validate(messages)
    first, second = messages[1]["content"]
    assert first == tool_use("t1") and second["id"] != "t1"
    assert messages[2]["content"] == [result("t1", "one"), result(second["id"], "one")]
    third = messages[3]["content"][0]["id"]
    assert third not in ("t1", second["id"])
    assert messages[4]["content"] == [result(third, "two")]
    assert journal[1].content[1]["id"] == "t1"  # the journal is left alone
