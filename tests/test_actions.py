"""Pending actions: client-routed tools and approvals suspend a run; answers resume it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from tests.faults import arm_crash, lapse_soon
from tests.gateway_apps import http_for
from wakeful import (
    HandlerContext,
    LogRecord,
    Registration,
    Registry,
    RunFinished,
    Runtime,
    ScriptedModel,
    define_agent,
    define_tool,
    tool,
)
from wakeful.actions import (
    ActionError,
    ActionNotAuthorizedError,
    ActionNotPendingError,
    ActionValidationError,
)
from wakeful.agent import RunResult
from wakeful.contracts import ApprovalInfo, CallInfo, OutputInfo
from wakeful.errors import ToolDisabledError
from wakeful.events import ActionRequested, ActionSettled, ToolOutcome
from wakeful.gateway import bearer_tokens
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio

URL = "/page/p"
U1 = {"user": "u1"}
U2 = {"user": "u2"}


class NoArgs(msgspec.Struct):
    pass


class Selection(msgspec.Struct):
    text: str


class Delete(msgspec.Struct):
    path: str


class Done(msgspec.Struct):
    deleted: str


get_selected = define_tool(
    id="browser.getSelectedText/v1",
    description="The text the user selected in the page",
    input=NoArgs,
    output=Selection,
)


def deleter(executions: list[str]) -> Any:
    @tool(id="fs.delete/v1", description="Delete a file", input=Delete, output=Done)
    async def delete(ctx: Any) -> Done:
        executions.append(ctx.input.path)
        return Done(ctx.input.path)

    return delete


def use(call_id: str, name: str, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def model_for(*calls: dict[str, Any]) -> ScriptedModel:
    """First step: ``calls``; then an answer that quotes the tool results it saw."""

    def respond(request: ModelRequest) -> ModelResponse:
        if not any(m["role"] == "assistant" for m in request.messages):
            return ModelResponse(content=list(calls), stop_reason="tool_use")
        seen = json.dumps(request.messages[-1]["content"], ensure_ascii=False)
        return ModelResponse(
            content=[{"type": "text", "text": f"I saw: {seen}"}], stop_reason="end_turn"
        )

    return ScriptedModel(respond)


def app(
    tools: dict[str, Any],
    calls: list[dict[str, Any]],
    runs: list[RunResult],
    *,
    register: bool = False,
) -> Registry:
    """``register``: the registry knows the agent, so its clients recheck ``enabled``."""
    agent = define_agent(name="page", instructions=".", model=model_for(*calls), tools=tools)
    reg = Registry()
    if register:
        reg.agent(agent)

    @reg.entity("page")
    async def page(ctx: HandlerContext) -> None:
        ctx.use_agent(agent)
        runs.append(await ctx.agent.run())

    return reg


async def log(rt: Runtime, url: str = URL) -> list[Any]:
    return [r.event async for r in rt.events(url) if isinstance(r, LogRecord)]


async def of_type(rt: Runtime, kind: type, url: str = URL) -> list[Any]:
    return [e for e in await log(rt, url) if isinstance(e, kind)]


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def settled_run(rt: Runtime) -> RunFinished:
    await rt.wait_idle(URL)
    finished = await of_type(rt, RunFinished)
    assert len(finished) == 1, finished
    return finished[0]


async def outcome(rt: Runtime, call_id: str) -> ToolOutcome:
    outcomes = [o for o in await of_type(rt, ToolOutcome) if o.tool_call_id == call_id]
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


def text(o: ToolOutcome) -> str:
    return " ".join(b.get("text", "") for b in o.content)


def pending_c1(
    approval: bool, executions: list[str], **registration: Any
) -> tuple[dict[str, Registration], list[dict[str, Any]]]:
    """The tools and the model's call for one pending action ``c1`` of tool ``t``: an
    approval of the deleter (of ``/tmp/a``), or a client tool's output (``get_selected``)."""
    if approval:
        tool = Registration(deleter(executions), needs_approval=True, **registration)
        return {"t": tool}, [use("c1", "t", {"path": "/tmp/a"})]
    return {"t": Registration(get_selected, **registration)}, [use("c1", "t", {})]


async def answer_c1(rt: Runtime, approve: bool, said: str) -> None:
    """Answer the pending ``c1`` as U1: approve it, or submit ``{"text": said}``."""
    if approve:
        await rt.approve(URL, "c1", identity=U1)
    else:
        await rt.submit_tool_result(URL, "c1", {"text": said}, identity=U1)


async def suspended(rt: Runtime, pending: int = 1) -> None:
    status = await rt.wait_idle(URL)
    assert status.status == "suspended"
    assert status.pending_actions == pending
    assert not await of_type(rt, RunFinished)


# -- client-routed tools ----------------------------------------------------------------


async def test_client_tool_suspends_and_the_same_run_resumes_on_a_valid_output(
    cluster: Any,
) -> None:
    runs: list[RunResult] = []
    observed: list[OutputInfo] = []
    reg = app(
        {"getSelectedText": Registration(get_selected, on_output=observed.append)},
        [use("s1", "getSelectedText", {})],
        runs,
    )
    rt = await cluster.runtime(reg)
    before = int(time.time() * 1000)
    await rt.send(URL, "summarise my selection", identity=U1)
    await suspended(rt)
    assert [r.status for r in runs] == ["suspended"]
    [requested] = await of_type(rt, ActionRequested)
    assert requested.tool_call_id == "s1"
    assert requested.tool == "getSelectedText"
    assert requested.kind == "client"
    assert requested.input == {}
    assert requested.authorized == U1
    assert requested.run_id == runs[0].run_id
    assert before <= requested.created_ms <= int(time.time() * 1000)
    assert requested.expires_ms == 0
    assert [(a.tool_call_id, a.tool) for a in await rt.pending_actions(URL)] == [
        ("s1", "getSelectedText")
    ]
    assert observed == []

    await rt.submit_tool_result(URL, "s1", {"text": "hello world"}, identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert finished.run_id == runs[0].run_id
    assert runs[-1].status == "completed" and runs[-1].run_id == runs[0].run_id
    assert "hello world" in (finished.response or "")
    assert (await rt.status(URL)).pending_actions == 0
    assert await rt.pending_actions(URL) == []
    assert [(o.tool_call_id, o.output) for o in observed] == [("s1", Selection("hello world"))]
    assert isinstance(observed[0].output, Selection)
    result = await outcome(rt, "s1")
    assert not result.is_error and result.details == {"output": {"text": "hello world"}}
    [answer] = await of_type(rt, ActionSettled)
    assert answer.decision == "output" and answer.by == U1


async def test_an_invalid_output_is_refused_and_the_action_stays_pending(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    rt = await cluster.runtime(reg)
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    with pytest.raises(ActionValidationError, match="text") as refused:
        await rt.submit_tool_result(URL, "s1", {"text": 5}, identity=U1)
    assert "s1" in str(refused.value)
    with pytest.raises(ActionValidationError, match="text"):
        await rt.submit_tool_result(URL, "s1", {}, identity=U1)
    # A client tool is not an approval.
    with pytest.raises(ActionError, match="client tool result"):
        await rt.approve(URL, "s1", identity=U1)
    await asyncio.sleep(0.2)
    await suspended(rt)
    assert [a.tool_call_id for a in await rt.pending_actions(URL)] == ["s1"]
    assert await of_type(rt, ActionSettled) == []

    await rt.submit_tool_result(URL, "s1", {"text": "fine"}, identity=U1)
    assert (await settled_run(rt)).status == "completed"
    assert text(await outcome(rt, "s1")) == '{"text": "fine"}'
    with pytest.raises(ActionNotPendingError):
        await rt.submit_tool_result(URL, "s1", {"text": "again"}, identity=U1)


async def test_two_calls_in_one_step_partial_submission_persists(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app(
        {"getSelectedText": get_selected},
        [use("s1", "getSelectedText", {}), use("s2", "getSelectedText", {})],
        runs,
    )
    rt = await cluster.runtime(reg)
    await rt.send(URL, "go", identity=U1)
    await suspended(rt, pending=2)
    await rt.submit_tool_result(URL, "s2", {"text": "second"}, identity=U1)
    await suspended(rt, pending=1)
    assert [a.tool_call_id for a in await rt.pending_actions(URL)] == ["s1"]
    assert [o.tool_call_id for o in await of_type(rt, ToolOutcome)] == ["s2"]
    assert runs[-1].status == "suspended"

    await rt.submit_tool_result(URL, "s1", {"text": "first"}, identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed" and finished.run_id == runs[0].run_id
    assert "first" in (finished.response or "") and "second" in (finished.response or "")
    assert text(await outcome(rt, "s1")) == '{"text": "first"}'
    assert text(await outcome(rt, "s2")) == '{"text": "second"}'


# -- approvals ----------------------------------------------------------------------------


async def approval_app(
    cluster: Any, executions: list[str], path: str = "/tmp/a", **options: Any
) -> tuple[Runtime, list[RunResult]]:
    runs: list[RunResult] = []
    reg = app(
        {"delete": Registration(deleter(executions), **options)},
        [use("d1", "delete", {"path": path})],
        runs,
    )
    rt = await cluster.runtime(reg)
    await rt.send(URL, "clean up", identity=U1)
    return rt, runs


async def test_needs_approval_waits_and_approve_runs_the_tool_once(cluster: Any) -> None:
    executions: list[str] = []
    rt, runs = await approval_app(cluster, executions, needs_approval=True)
    await suspended(rt)
    assert executions == []
    [requested] = await rt.pending_actions(URL)
    assert (requested.kind, requested.tool, requested.input) == (
        "approval",
        "delete",
        {"path": "/tmp/a"},
    )
    with pytest.raises(ActionError, match="approval"):
        await rt.submit_tool_result(URL, "d1", {"deleted": "/tmp/a"}, identity=U1)

    before = int(time.time() * 1000)
    await rt.approve(URL, "d1", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed" and finished.run_id == runs[0].run_id
    assert executions == ["/tmp/a"]
    assert text(await outcome(rt, "d1")) == '{"deleted": "/tmp/a"}'
    [decision] = await of_type(rt, ActionSettled)
    assert decision.decision == "approved" and decision.by == U1
    assert decision.edited_input is None
    assert before <= decision.at_ms <= int(time.time() * 1000)
    with pytest.raises(ActionNotPendingError):
        await rt.approve(URL, "d1", identity=U1)
    await asyncio.sleep(0.2)
    assert executions == ["/tmp/a"]


async def test_approve_with_edited_input_validates_and_runs_the_edit(cluster: Any) -> None:
    executions: list[str] = []
    rt, _ = await approval_app(cluster, executions, needs_approval=True)
    await suspended(rt)
    with pytest.raises(ActionValidationError, match="path"):
        await rt.approve(URL, "d1", edited_input={"path": 7}, identity=U1)
    with pytest.raises(ActionValidationError, match="path"):
        await rt.approve(URL, "d1", edited_input={}, identity=U1)
    await suspended(rt)
    assert executions == []

    await rt.approve(URL, "d1", edited_input={"path": "/tmp/b"}, identity=U1)
    assert (await settled_run(rt)).status == "completed"
    assert executions == ["/tmp/b"]
    assert text(await outcome(rt, "d1")) == '{"deleted": "/tmp/b"}'
    [decision] = await of_type(rt, ActionSettled)
    assert (decision.decision, decision.edited_input, decision.by) == (
        "approved",
        {"path": "/tmp/b"},
        U1,
    )
    assert decision.at_ms > 0


async def test_deny_gives_the_model_the_reason_and_who_denied(cluster: Any) -> None:
    executions: list[str] = []
    rt, _ = await approval_app(cluster, executions, needs_approval=True)
    await suspended(rt)
    await rt.deny(URL, "d1", "that file is still needed", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert executions == []
    result = await outcome(rt, "d1")
    assert result.is_error
    assert "denied" in text(result)
    assert "that file is still needed" in text(result)
    assert "u1" in text(result)
    assert "that file is still needed" in (finished.response or "")
    [decision] = await of_type(rt, ActionSettled)
    assert (decision.decision, decision.error, decision.by) == (
        "denied",
        "that file is still needed",
        U1,
    )
    assert decision.at_ms > 0


async def test_needs_approval_resolver_asks_only_when_it_says_so(cluster: Any) -> None:
    """The resolver sees the call info (identity, client data, runtime context) and the
    typed input: here only guests need an approval."""
    executions: list[str] = []
    asked: list[CallInfo] = []

    def only_guests(info: CallInfo) -> bool:
        asked.append(info)
        return (info.identity or {}).get("role") == "guest"

    runs: list[RunResult] = []
    reg = app(
        {"delete": Registration(deleter(executions), needs_approval=only_guests)},
        [use("d1", "delete", {"path": "/tmp/a"})],
        runs,
    )
    rt = await cluster.runtime(reg)
    await rt.send("/page/admin", "clean up", identity={"user": "a", "role": "admin"})
    await rt.send("/page/guest", "clean up", identity={"user": "g", "role": "guest"})
    assert (await rt.wait_idle("/page/admin")).pending_actions == 0
    assert executions == ["/tmp/a"]
    [admin_run] = await of_type(rt, RunFinished, "/page/admin")
    assert admin_run.status == "completed"

    guest = await rt.wait_idle("/page/guest")
    assert guest.pending_actions == 1
    assert executions == ["/tmp/a"]
    assert {info.entity_url for info in asked} == {"/page/admin", "/page/guest"}
    await rt.approve("/page/guest", "d1", identity={"user": "g", "role": "guest"})
    await rt.wait_idle("/page/guest")
    assert executions == ["/tmp/a", "/tmp/a"]
    [guest_run] = await of_type(rt, RunFinished, "/page/guest")
    assert guest_run.status == "completed"


async def test_needs_approval_resolver_can_decide_by_the_input(cluster: Any) -> None:
    executions: list[str] = []

    def outside_tmp(info: ApprovalInfo) -> bool:
        return not info.input.path.startswith("/tmp/")

    runs: list[RunResult] = []
    reg = app(
        {"delete": Registration(deleter(executions), needs_approval=outside_tmp)},
        [use("d1", "delete", {"path": "/tmp/a"}), use("d2", "delete", {"path": "/etc/passwd"})],
        runs,
    )
    rt = await cluster.runtime(reg)
    await rt.send("/page/p", "clean up", identity={"user": "u"})
    status = await rt.wait_idle("/page/p")
    assert status.pending_actions == 1
    assert executions == ["/tmp/a"]
    [action] = await rt.pending_actions("/page/p")
    assert (action.tool_call_id, action.input) == ("d2", {"path": "/etc/passwd"})


# -- failing, cancelling, disabling ----------------------------------------------------


@pytest.mark.parametrize("how", ["fail", "cancel"])
async def test_fail_and_cancel_give_the_model_an_error_result(cluster: Any, how: str) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    rt = await cluster.runtime(reg)
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    if how == "fail":
        await rt.fail_action(URL, "s1", "no text is selected", identity=U1)
    else:
        await rt.cancel_action(URL, "s1", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed" and finished.run_id == runs[0].run_id
    result = await outcome(rt, "s1")
    assert result.is_error
    if how == "fail":
        assert "failed" in text(result) and "no text is selected" in text(result)
    else:
        assert "cancelled" in text(result)
    [answer] = await of_type(rt, ActionSettled)
    assert answer.decision == ("failed" if how == "fail" else "cancelled")
    assert answer.by == U1


async def test_cancel_also_settles_an_approval(cluster: Any) -> None:
    executions: list[str] = []
    rt, _ = await approval_app(cluster, executions, needs_approval=True)
    await suspended(rt)
    with pytest.raises(ActionError):
        await rt.fail_action(URL, "d1", "nope", identity=U1)  # fail is for client tools
    await rt.cancel_action(URL, "d1", identity=U1)
    assert (await settled_run(rt)).status == "completed"
    assert executions == []
    assert "cancelled" in text(await outcome(rt, "d1"))


@pytest.mark.parametrize("kind", ["client", "approval"])
async def test_a_skipped_call_gives_the_model_a_synthetic_output_observed_by_on_output(
    cluster: Any, kind: str
) -> None:
    executions: list[str] = []
    observed: list[OutputInfo] = []
    runs: list[RunResult] = []

    async def on_output(info: OutputInfo) -> None:
        observed.append(info)

    tools, calls = pending_c1(kind == "approval", executions, on_output=on_output)
    rt = await cluster.runtime(app(tools, calls, runs))
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    with pytest.raises(ActionNotAuthorizedError):
        await rt.skip_action(URL, "c1", "not yours", identity=U2)
    await rt.skip_action(URL, "c1", "not needed now", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert executions == []
    synthetic = {"skipped": True, "reason": "not needed now"}
    result = await outcome(rt, "c1")
    assert not result.is_error
    assert result.details == {"output": synthetic, "skipped": True}
    assert "skipped" in text(result) and "not needed now" in text(result)
    assert "not needed now" in (finished.response or "")  # the model saw it
    [info] = observed
    assert info.skipped and info.output == synthetic and info.tool_call_id == "c1"
    [answer] = await of_type(rt, ActionSettled)
    assert answer.decision == "skipped" and answer.by == U1
    with pytest.raises(ActionNotPendingError):
        await rt.skip_action(URL, "c1", identity=U1)


@pytest.mark.parametrize("answer", ["submit", "approve"])
async def test_a_tool_disabled_while_pending_refuses_an_answer_and_stays_pending(
    cluster: Any, answer: str
) -> None:
    """The client rechecks ``enabled`` (its registry knows the agent): an output or an
    approval is refused with a clear error; cancel and fail stay available."""
    enabled = {"on": True}
    executions: list[str] = []
    runs: list[RunResult] = []
    is_on = lambda _info: enabled["on"]  # noqa: E731
    tools, calls = pending_c1(answer == "approve", executions, enabled=is_on)
    rt = await cluster.runtime(app(tools, calls, runs, register=True))
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    enabled["on"] = False
    with pytest.raises(ToolDisabledError, match=r"'t'.*disabled.*stays pending"):
        await answer_c1(rt, answer == "approve", "x")
    await suspended(rt)  # nothing was written: the action is still pending
    assert [a.tool_call_id for a in await rt.pending_actions(URL)] == ["c1"]
    assert not await of_type(rt, ActionSettled)
    # Over HTTP: 409 with the error's type.
    http = http_for(rt, authenticate=bearer_tokens({"t1": U1}))
    verb, body = ("submit", {"output": {"text": "x"}}) if answer == "submit" else ("approve", {})
    async with http:
        refused = await http.post(
            f"/entities/page/p/actions/c1/{verb}",
            json=body,
            headers={"Authorization": "Bearer t1"},
        )
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "ToolDisabledError"
    # Cancel stays available.
    await rt.cancel_action(URL, "c1", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert executions == []
    assert "cancelled" in text(await outcome(rt, "c1"))


@pytest.mark.parametrize("answer", ["submit", "approve"])
async def test_an_answer_the_run_finds_disabled_is_refused_and_the_action_reopens(
    cluster: Any, answer: str
) -> None:
    """A client that cannot recheck (its registry lacks the agent) writes the answer;
    the run rechecks, refuses it, and the action is pending again, saying why."""
    enabled = {"on": True}
    executions: list[str] = []
    runs: list[RunResult] = []
    is_on = lambda _info: enabled["on"]  # noqa: E731
    tools, calls = pending_c1(answer == "approve", executions, enabled=is_on)
    rt = await cluster.runtime(app(tools, calls, runs))
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    enabled["on"] = False
    await answer_c1(rt, answer == "approve", "x")
    await suspended(rt)
    [again] = await rt.pending_actions(URL)
    assert again.tool_call_id == "c1" and "disabled" in (again.refused or "")
    assert not await of_type(rt, ToolOutcome)
    # The tool is enabled again: the same action can now be answered, once.
    enabled["on"] = True
    await answer_c1(rt, answer == "approve", "now")
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert not (await outcome(rt, "c1")).is_error
    assert executions == ([] if answer == "submit" else ["/tmp/a"])
    assert (await rt.status(URL)).pending_actions == 0


@pytest.mark.parametrize("how", ["fail", "cancel", "skip"])
async def test_fail_cancel_and_skip_stay_available_while_the_tool_is_disabled(
    cluster: Any, how: str
) -> None:
    enabled = {"on": True}
    runs: list[RunResult] = []
    tools = {"t": Registration(get_selected, enabled=lambda _info: enabled["on"])}
    rt = await cluster.runtime(app(tools, [use("c1", "t", {})], runs, register=True))
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    enabled["on"] = False
    if how == "fail":
        await rt.fail_action(URL, "c1", "no browser", identity=U1)
    elif how == "cancel":
        await rt.cancel_action(URL, "c1", identity=U1)
    else:
        await rt.skip_action(URL, "c1", "not now", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert (await rt.status(URL)).pending_actions == 0


# -- expiry ---------------------------------------------------------------------------


async def test_an_action_expires_by_itself_and_the_model_sees_a_failure(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app(
        {"getSelectedText": Registration(get_selected, action_ttl=0.3)},
        [use("s1", "getSelectedText", {})],
        runs,
    )
    rt = await cluster.runtime(reg)
    await rt.send(URL, "go", identity=U1)
    await until(lambda: of_type(rt, ActionRequested))
    [requested] = await of_type(rt, ActionRequested)
    assert 250 <= requested.expires_ms - requested.created_ms <= 350

    async def finished() -> bool:
        return bool(await of_type(rt, RunFinished))

    await until(finished)
    run = await settled_run(rt)
    assert run.status == "completed" and run.run_id == runs[0].run_id
    [answer] = await of_type(rt, ActionSettled)
    assert answer.decision == "expired" and answer.by is None
    result = await outcome(rt, "s1")
    assert result.is_error and "expired" in text(result)
    assert (await rt.status(URL)).pending_actions == 0
    with pytest.raises(ActionNotPendingError):
        await rt.submit_tool_result(URL, "s1", {"text": "late"}, identity=U1)
    assert len(await of_type(rt, ToolOutcome)) == 1


async def test_submitting_after_expiry_but_before_the_timer_is_refused(cluster: Any) -> None:
    """A client that answers late is refused even if the timer has not fired yet."""
    runs: list[RunResult] = []
    reg = app(
        {"getSelectedText": Registration(get_selected, action_ttl=0.3)},
        [use("s1", "getSelectedText", {})],
        runs,
    )
    client = await cluster.runtime(reg, run_worker=False)
    worker = await cluster.runtime(reg)
    await client.send(URL, "go", identity=U1)
    await until(lambda: of_type(client, ActionRequested))
    await worker.close()
    cluster.runtimes.remove(worker)
    await asyncio.sleep(0.4)
    with pytest.raises(ActionNotPendingError, match="expired"):
        await client.submit_tool_result(URL, "s1", {"text": "late"}, identity=U1)
    await cluster.runtime(reg)
    run = await settled_run(client)
    assert run.status == "completed"
    assert [a.decision for a in await of_type(client, ActionSettled)] == ["expired"]
    assert "expired" in text(await outcome(client, "s1"))


# -- authorisation ----------------------------------------------------------------------


async def test_only_the_identity_that_started_the_run_may_answer(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    rt = await cluster.runtime(reg)
    # client_data that looks like another identity must never authorise it.
    await rt.send(URL, "go", identity=U1, client_data=U2)
    await suspended(rt)
    [requested] = await rt.pending_actions(URL)
    assert requested.authorized == U1
    for who in (U2, None, {"user": "u1", "role": "x"}):
        with pytest.raises(ActionNotAuthorizedError):
            await rt.submit_tool_result(URL, "s1", {"text": "x"}, identity=who)
        with pytest.raises(ActionNotAuthorizedError):
            await rt.cancel_action(URL, "s1", identity=who)
    await suspended(rt)
    await rt.submit_tool_result(URL, "s1", {"text": "mine"}, identity=U1)
    assert (await settled_run(rt)).status == "completed"
    assert text(await outcome(rt, "s1")) == '{"text": "mine"}'


async def test_a_custom_authorizer_decides_who_may_answer(cluster: Any) -> None:
    seen: list[tuple[str, Any]] = []

    def admins_only(action: ActionRequested, identity: dict[str, str] | None) -> bool:
        seen.append((action.tool_call_id, identity))
        return (identity or {}).get("role") == "admin"

    executions: list[str] = []
    runs: list[RunResult] = []
    reg = app(
        {"delete": Registration(deleter(executions), needs_approval=True)},
        [use("d1", "delete", {"path": "/tmp/a"})],
        runs,
    )
    await cluster.runtime(reg)  # the worker
    client = Runtime(
        reg,
        settings=cluster.settings(),
        run_worker=False,
        redis=cluster.redis(),
        action_authorizer=admins_only,
    )
    await client.start()
    cluster.runtimes.append(client)
    await client.send(URL, "clean up", identity=U1)
    status = await client.wait_idle(URL)
    assert status.pending_actions == 1
    with pytest.raises(ActionNotAuthorizedError):
        await client.approve(URL, "d1", identity=U1)  # the starter is no admin
    admin = {"user": "boss", "role": "admin"}
    await client.approve(URL, "d1", identity=admin)
    assert (await settled_run(client)).status == "completed"
    assert executions == ["/tmp/a"]
    assert seen == [("d1", U1), ("d1", admin)]
    [decision] = await of_type(client, ActionSettled)
    assert decision.by == admin


# -- races, restarts and crashes ----------------------------------------------------------


async def test_two_concurrent_submissions_exactly_one_wins(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    rt = await cluster.runtime(reg)
    other = await cluster.runtime(reg, run_worker=False)
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    results = await asyncio.gather(
        rt.submit_tool_result(URL, "s1", {"text": "A"}, identity=U1),
        other.submit_tool_result(URL, "s1", {"text": "B"}, identity=U1),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, str)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1, results
    assert isinstance(lost[0], ActionNotPendingError)
    assert (await settled_run(rt)).status == "completed"
    answers = await of_type(rt, ActionSettled)
    assert len(answers) == 1
    winner = answers[0].output["text"]
    assert text(await outcome(rt, "s1")) == json.dumps({"text": winner})
    settled_ids = [r.id async for r in rt.events(URL) if isinstance(r.event, ActionSettled)]
    assert won == settled_ids


async def test_a_suspended_run_survives_a_worker_restart(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    first = await cluster.runtime(reg)
    await first.send(URL, "go", identity=U1)
    await suspended(first)
    await first.close()
    cluster.runtimes.remove(first)

    second = await cluster.runtime(reg)
    assert [a.tool_call_id for a in await second.pending_actions(URL)] == ["s1"]
    await second.submit_tool_result(URL, "s1", {"text": "after restart"}, identity=U1)
    finished = await settled_run(second)
    assert finished.status == "completed" and finished.run_id == runs[0].run_id
    assert "after restart" in (finished.response or "")
    assert [r.status for r in runs] == ["suspended", "completed"]
    assert len(await of_type(second, ToolOutcome)) == 1


@pytest.mark.parametrize("point", ["wake:before-commit", "wake:after-commit"])
async def test_a_submission_racing_a_worker_crash_is_applied_once(cluster: Any, point: str) -> None:
    executions: list[str] = []
    runs: list[RunResult] = []
    reg = app(
        {
            "getSelectedText": get_selected,
            "delete": Registration(deleter(executions), needs_approval=True),
        },
        [use("s1", "getSelectedText", {}), use("d1", "delete", {"path": "/tmp/a"})],
        runs,
    )
    first = await cluster.runtime(reg)
    assert first.worker is not None
    await first.send(URL, "go", identity=U1)
    await suspended(first, pending=2)

    crashed = arm_crash(first, point)
    # Both answers land while the wake that takes them dies.
    await asyncio.gather(
        first.submit_tool_result(URL, "s1", {"text": "sel"}, identity=U1),
        first.approve(URL, "d1", identity=U1),
    )
    await asyncio.wait_for(crashed.wait(), 15)
    await lapse_soon(first)
    await first.close()
    cluster.runtimes.remove(first)

    second = await cluster.runtime(reg)
    await until(lambda: of_type(second, RunFinished))
    finished = await settled_run(second)
    assert finished.status == "completed"
    assert len(await of_type(second, ActionSettled)) == 2
    assert text(await outcome(second, "s1")) == '{"text": "sel"}'
    assert not (await outcome(second, "d1")).is_error
    assert executions.count("/tmp/a") == 1
    assert (await second.status(URL)).pending_actions == 0
    with pytest.raises(ActionNotPendingError):
        await second.submit_tool_result(URL, "s1", {"text": "again"}, identity=U1)


# -- the seed's browser example ------------------------------------------------------------


async def test_browser_example_client_answers_get_selected_text(cluster: Any) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    server = await cluster.runtime(reg)
    browser = await cluster.runtime(reg, run_worker=False)  # the page's client

    async def selected_text(_input: Any) -> dict[str, Any]:
        return {"text": "Redis Streams are append-only logs."}

    handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {"getSelectedText": selected_text}
    answered: list[str] = []

    async def client_loop() -> None:
        while True:
            for action in await browser.pending_actions(URL):
                if action.kind == "client" and action.tool_call_id not in answered:
                    output = await handlers[action.tool](action.input)
                    await browser.submit_tool_result(URL, action.tool_call_id, output, identity=U1)
                    answered.append(action.tool_call_id)
            if await of_type(browser, RunFinished):
                return
            await asyncio.sleep(0.05)

    await server.send(URL, "What did I select?", identity=U1)
    await asyncio.wait_for(client_loop(), 20)
    finished = await settled_run(browser)
    assert answered == ["s1"]
    assert finished.status == "completed"
    assert "Redis Streams are append-only logs." in (finished.response or "")


async def test_a_message_sent_while_suspended_does_not_hide_the_submitted_output(
    cluster: Any,
) -> None:
    runs: list[RunResult] = []
    reg = app({"getSelectedText": get_selected}, [use("s1", "getSelectedText", {})], runs)
    rt = await cluster.runtime(reg)
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    await rt.send(URL, "are you still there?", identity=U1)
    await suspended(rt)
    await rt.submit_tool_result(URL, "s1", {"text": "the selection"}, identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    assert "the selection" in (finished.response or "")
    assert "interrupted" not in json.dumps(await rt.conversation(URL))


async def test_skip_over_http(cluster: Any) -> None:
    runs: list[RunResult] = []
    rt = await cluster.runtime(app({"t": Registration(get_selected)}, [use("c1", "t", {})], runs))
    http = http_for(rt)
    async with http:
        await http.post("/entities/page/p/messages", json={"payload": "go"})
        await suspended(rt)
        skipped = await http.post(
            "/entities/page/p/actions/c1/skip", json={"reason": "later, over HTTP"}
        )
        assert skipped.status_code == 200, skipped.text
        again = await http.post("/entities/page/p/actions/c1/skip", json={})
        assert again.status_code == 409
        spec = (await http.get("/openapi.json")).json()
    assert "/entities/{type}/{id}/actions/{call}/skip" in spec["paths"]
    finished = await settled_run(rt)
    assert "later, over HTTP" in (finished.response or "")
    assert (await outcome(rt, "c1")).details["output"]["skipped"] is True
