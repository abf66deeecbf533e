"""Trust boundaries between identities: entities belong to their creator, runs to the
identity that started them, children to the run that spawned them, idempotency keys
to their caller. One test per attack of issue 13 (items 1, 2, 3 and 9)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.gateway_apps import ALICE as AS_ALICE
from tests.gateway_apps import BOB as AS_BOB
from tests.gateway_apps import TOKENS, http_for, register_echo
from wakeful import (
    HandlerContext,
    LogRecord,
    Registration,
    Registry,
    Runtime,
    ScriptedModel,
    define_agent,
    tool,
)
from wakeful.actions import ActionNotAuthorizedError
from wakeful.authorization import (
    EntityAccess,
    allow_all,
    load_authorizer,
    owner_only,
)
from wakeful.errors import ConfigError, OwnerChangedError
from wakeful.events import (
    ActionSettled,
    Created,
    Message,
    MessageHeld,
    RunFinished,
    RunStarted,
    UserTurn,
)
from wakeful.gateway import bearer_tokens
from wakeful.keys import owner_mark
from wakeful.models import ModelRequest, ModelResponse
from wakeful.run_owner import split_inputs
from wakeful.state import SystemState

pytestmark = pytest.mark.anyio

ALICE, BOB = {"user": "alice"}, {"user": "bob"}  # identities (AS_ALICE: her headers)
VAULT = "/vault/v"


class Forget(msgspec.Struct):
    key: str


class Forgot(msgspec.Struct):
    key: str


@tool(id="vault.forget/v1", description="Forget a fact", input=Forget, output=Forgot)
async def forget(ctx: Any) -> Forgot:
    return Forgot(ctx.input.key)


def respond(request: ModelRequest) -> ModelResponse:
    """Each run first asks to forget the fact its message names, then says it is done.
    Call ids differ per run (the conversation's length), as a real model's do."""
    content = request.messages[-1]["content"]
    if isinstance(content, list) and content[-1].get("type") == "tool_result":
        return ModelResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")
    said = content if isinstance(content, str) else content[-1].get("text", "")
    call = {
        "type": "tool_use",
        "id": f"forget-{len(request.messages)}",
        "name": "forget",
        "input": {"key": said.split()[-1]},
    }
    return ModelResponse(content=[call], stop_reason="tool_use")


def registry(forgotten: list[tuple[str, Any]]) -> Registry:
    agent = define_agent(
        name="vault",
        instructions=".",
        model=ScriptedModel(respond),
        tools={
            "forget": Registration(
                forget,
                needs_approval=True,
                # What was forgotten, and for whom (the identity the run belongs to).
                on_output=lambda info: forgotten.append((info.output.key, info.identity)),
            )
        },
    )
    reg = Registry()

    @reg.entity("vault")
    async def vault(ctx: HandlerContext) -> None:
        ctx.use_agent(agent)
        await ctx.agent.run()

    register_echo(reg)

    @reg.entity("parent")
    async def parent(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            await ctx.spawn("vault", f"kid-{m.payload}", initial_message=f"forget {m.payload}")

    return reg


def gateway(rt: Runtime, **options: Any) -> httpx.AsyncClient:
    return http_for(rt, authenticate=bearer_tokens(TOKENS), **options)


async def log(rt: Runtime, url: str) -> list[Any]:
    return [r.event async for r in rt.events(url) if isinstance(r, LogRecord)]


async def suspended_on(rt: Runtime, url: str) -> Any:
    """Wait until ``url`` rests on exactly one pending action, and return it."""
    status = await rt.wait_idle(url)
    assert status.status == "suspended", status
    [action] = await rt.pending_actions(url)
    return action


# -- item 1: per-entity authorisation in serve --------------------------------------------


async def test_another_identity_can_neither_read_nor_write_an_entity(cluster: Any) -> None:
    rt = await cluster.runtime(registry([]))
    async with gateway(rt) as http:  # the default with authentication: the owner policy
        made = await http.post("/entities/echo/a1", json={"message": "secret"}, headers=AS_ALICE)
        assert made.status_code == 201
        await rt.wait_idle("/echo/a1")
        assert (await rt.status("/echo/a1")).owner == ALICE
        base = "/entities/echo/a1"
        for path in ("", "/state", "/children", "/events?follow=0", "/actions"):
            assert (await http.get(base + path, headers=AS_ALICE)).status_code == 200, path
            refused = await http.get(base + path, headers=AS_BOB)
            assert refused.status_code == 403, path
            assert "secret" not in refused.text
        for path, body in (
            ("", {"message": "mine now"}),
            ("/messages", {"payload": "mine now"}),
            ("/cancel", {}),
            ("/actions/x/approve", {}),
        ):
            refused = await http.post(base + path, json=body, headers=AS_BOB)
            assert refused.status_code == 403, path
            assert refused.json()["error"]["type"] == "Forbidden"
    payloads = [e.payload for e in await log(rt, "/echo/a1") if type(e).__name__ == "Message"]
    assert payloads == ["secret"]  # nothing of bob's was written


async def test_listings_show_only_the_callers_entities(cluster: Any) -> None:
    rt = await cluster.runtime(registry([]))
    await rt.send("/echo/nobodys", "made without an identity")
    async with gateway(rt) as http:
        for name, who in (("a1", AS_ALICE), ("a2", AS_ALICE), ("b1", AS_BOB)):
            assert (await http.post(f"/entities/echo/{name}", json={}, headers=who)).is_success
        assert (await http.get("/entities/echo", headers=AS_ALICE)).json() == [
            "/echo/a1",
            "/echo/a2",
        ]
        assert (await http.get("/entities/echo?limit=1", headers=AS_ALICE)).json() == ["/echo/a1"]
        assert (await http.get("/entities/echo", headers=AS_BOB)).json() == ["/echo/b1"]
        # An entity created without an identity belongs to no token holder.
        assert (await http.get("/entities/echo/nobodys", headers=AS_ALICE)).status_code == 403
        # Reading a missing entity is a 404; writing creates it, owned by the writer.
        assert (await http.get("/entities/echo/none", headers=AS_BOB)).status_code == 404
    async with gateway(rt, authorize=allow_all) as http:  # the other mode: every caller
        assert len((await http.get("/entities/echo", headers=AS_BOB)).json()) == 4
        assert (await http.get("/entities/echo/a1/state", headers=AS_BOB)).status_code == 200


async def test_a_plugged_in_policy_decides_and_may_be_async(cluster: Any) -> None:
    asked: list[tuple[Any, str, str, bool, Any]] = []

    async def readers_read(request: EntityAccess) -> bool:
        asked.append((request.identity, request.url, request.access, request.exists, request.owner))
        return request.access == "read" or owner_only(request)

    rt = await cluster.runtime(registry([]))
    async with gateway(rt, authorize=readers_read) as http:
        assert (await http.post("/entities/echo/a1", json={}, headers=AS_ALICE)).is_success
        assert (await http.get("/entities/echo/a1", headers=AS_BOB)).status_code == 200
        sent = await http.post("/entities/echo/a1/messages", json={"payload": 1}, headers=AS_BOB)
        assert sent.status_code == 403
    assert asked[0] == (ALICE, "/echo/a1", "write", False, None)
    assert (BOB, "/echo/a1", "read", True, ALICE) in asked


async def test_an_entity_created_between_the_check_and_the_write_is_checked_again(
    cluster: Any,
) -> None:
    """bob's create is allowed because the entity does not exist yet; alice creates it
    before bob's write lands: the write carries what the policy saw, so it is refused
    and decided again (403), and nothing of bob's is written."""
    rt = await cluster.runtime(registry([]))
    raced = False

    async def racing(request: EntityAccess) -> bool:
        nonlocal raced
        if request.identity == BOB and not raced:
            raced = True
            await rt.send(request.url, "alice's", identity=ALICE)
        return owner_only(request)

    async with gateway(rt, authorize=racing) as http:
        refused = await http.post(
            "/entities/echo/r1/messages", json={"payload": "bob's"}, headers=AS_BOB
        )
        assert refused.status_code == 403
    assert raced and (await rt.status("/echo/r1")).owner == ALICE
    payloads = [e.payload for e in await log(rt, "/echo/r1") if type(e).__name__ == "Message"]
    assert payloads == ["alice's"]


async def test_a_write_expecting_another_owner_writes_nothing(store: Any) -> None:
    url = "/echo/o1"
    await store.append_input(url, "echo", created=b"C", events=[("i", b"m")], owner=ALICE)
    for seen in (owner_mark(None, exists=False), owner_mark(BOB, exists=True), "~"):
        with pytest.raises(OwnerChangedError) as caught:
            await store.append_input(
                url, "echo", created=b"C", events=[("i", b"x")], expect_owner=seen
            )
        assert caught.value.seen == owner_mark(ALICE, exists=True)
    assert len(await store.read_log(url, "0-0")) == 2  # C and m
    ok = await store.append_input(
        url, "echo", created=b"C", events=[("i", b"y")], expect_owner=owner_mark(ALICE, exists=True)
    )
    assert ok.appended


def test_serve_policies_are_chosen_by_name_or_module() -> None:
    assert load_authorizer("owner") is owner_only
    assert load_authorizer("allow-all") is allow_all
    assert load_authorizer("wakeful.authorization:owner_only") is owner_only
    for bad, says in (
        ("everyone", "must be 'owner', 'allow-all' or module:function"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("wakeful.authorization:nothing", "is not a function"),
    ):
        with pytest.raises(ConfigError, match=says):
            load_authorizer(bad)


POLICY = ["--authorizer", "everyone"]


def test_serve_refuses_an_unknown_policy_before_it_starts() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", "serve", "wakeful.entities:registry", *POLICY],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "--authorizer 'everyone' must be 'owner', 'allow-all' or module:function" in done.stderr


# -- item 2: a run belongs to the identity that started it --------------------------------


async def test_a_message_of_another_identity_waits_for_its_own_run(cluster: Any) -> None:
    forgotten: list[tuple[str, Any]] = []
    rt = await cluster.runtime(registry(forgotten))
    await rt.send(VAULT, "forget city", identity=ALICE)
    alices = await suspended_on(rt, VAULT)
    assert alices.authorized == ALICE

    bob_sent = await rt.send(VAULT, "forget pet", identity=BOB)
    # bob's message does not join alice's run: it is held, and alice's call still
    # waits for alice alone.
    assert (await suspended_on(rt, VAULT)).tool_call_id == alices.tool_call_id
    events = await log(rt, VAULT)
    [held] = [e for e in events if isinstance(e, MessageHeld)]
    assert held.input_id == bob_sent and held.message.identity == BOB
    turns = [e for e in events if isinstance(e, UserTurn)]
    assert [t.identity for t in turns] == [ALICE]
    with pytest.raises(ActionNotAuthorizedError):
        await rt.approve(VAULT, alices.tool_call_id, identity=BOB)
    # Whatever bob tries, the refusal is the same and tells him nothing of the call
    # (that it waits for an approval, not a client's output).
    with pytest.raises(ActionNotAuthorizedError):
        await rt.submit_tool_result(VAULT, alices.tool_call_id, {"ok": 1}, identity=BOB)
    with pytest.raises(ActionNotAuthorizedError):
        await rt.fail_action(VAULT, alices.tool_call_id, "no", identity=BOB)
    assert forgotten == []

    await rt.approve(VAULT, alices.tool_call_id, identity=ALICE)
    # alice's run finishes, then bob's message starts a run of bob's own.
    bobs = await suspended_on(rt, VAULT)
    assert bobs.authorized == BOB and bobs.input == {"key": "pet"}
    assert forgotten == [("city", ALICE)]
    with pytest.raises(ActionNotAuthorizedError):
        await rt.approve(VAULT, bobs.tool_call_id, identity=ALICE)
    await rt.approve(VAULT, bobs.tool_call_id, identity=BOB)
    await rt.wait_idle(VAULT)
    assert forgotten == [("city", ALICE), ("pet", BOB)]
    events = await log(rt, VAULT)
    assert [e.identity for e in events if isinstance(e, RunStarted)] == [ALICE, BOB]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["completed"] * 2


async def test_bob_cannot_approve_alices_call_even_after_sending_a_message(cluster: Any) -> None:
    """The attack of issue 13, through a gateway that lets everyone write (allow-all):
    bob's message must not make alice's pending call his to approve."""
    forgotten: list[tuple[str, Any]] = []
    rt = await cluster.runtime(registry(forgotten))
    async with gateway(rt, authorize=allow_all) as http:
        sent = await http.post(
            f"/entities{VAULT}/messages", json={"payload": "forget city"}, headers=AS_ALICE
        )
        assert sent.status_code == 202
        alices = await suspended_on(rt, VAULT)
        joined = await http.post(
            f"/entities{VAULT}/messages", json={"payload": "forget pet"}, headers=AS_BOB
        )
        assert joined.status_code == 202
        await rt.wait_idle(VAULT)
        [pending] = (await http.get(f"/entities{VAULT}/actions", headers=AS_BOB)).json()
        assert pending["authorized"] == ALICE
        approve = f"/entities{VAULT}/actions/{alices.tool_call_id}/approve"
        refused = await http.post(approve, json={}, headers=AS_BOB)
        assert refused.status_code == 403
        assert forgotten == []
        assert (await http.post(approve, json={}, headers=AS_ALICE)).status_code == 200
        assert (await suspended_on(rt, VAULT)).authorized == BOB
    assert forgotten == [("city", ALICE)]


async def test_messages_of_two_identities_sent_together_start_two_runs(cluster: Any) -> None:
    """Sent before any wake, they would be batched into one wake: the batch is cut at
    the identity, so each message starts (or waits for) a run of its own."""
    rt = await cluster.runtime(registry([]), run_worker=False)
    await rt.send("/echo/e", "from alice", identity=ALICE)
    await rt.send("/echo/e", "from bob", identity=BOB)
    await rt.send("/echo/e", "from bob again", identity=BOB)
    await cluster.runtime(registry([]))  # the worker sees all three at once
    await rt.wait_idle("/echo/e")
    events = await log(rt, "/echo/e")
    started = [e.identity for e in events if isinstance(e, RunStarted)]
    assert started == [ALICE, BOB, BOB]
    responses = [e.response for e in events if isinstance(e, RunFinished)]
    assert responses == ["echo from alice", "echo from bob", "echo from bob again"]


# -- item 3: children inherit the identity of the run that spawned them -------------------


async def test_a_child_runs_for_the_identity_of_the_run_that_spawned_it(cluster: Any) -> None:
    forgotten: list[tuple[str, Any]] = []
    rt = await cluster.runtime(registry(forgotten))
    async with gateway(rt) as http:
        sent = await http.post(
            "/entities/parent/p/messages", json={"payload": "city"}, headers=AS_ALICE
        )
        assert sent.status_code == 202
        await rt.wait_idle("/parent/p")
        kid = "/vault/kid-city"
        action = await suspended_on(rt, kid)
        assert action.authorized == ALICE
        status = await rt.status(kid)
        assert status.owner == ALICE and status.parent == "/parent/p"
        # bob can neither read the child nor approve its call.
        assert (await http.get(f"/entities{kid}", headers=AS_BOB)).status_code == 403
        approve = f"/entities{kid}/actions/{action.tool_call_id}/approve"
        assert (await http.post(approve, json={}, headers=AS_BOB)).status_code == 403
    with pytest.raises(ActionNotAuthorizedError):
        await rt.approve(kid, action.tool_call_id, identity=BOB)
    with pytest.raises(ActionNotAuthorizedError):
        await rt.approve(kid, action.tool_call_id)  # no identity is no one's consent
    await rt.approve(kid, action.tool_call_id, identity=ALICE)
    await rt.wait_idle(kid)
    assert forgotten == [("city", ALICE)]


# -- item 9: idempotency keys are kept per identity ---------------------------------------


async def test_an_idempotency_key_of_another_identity_is_a_new_key(cluster: Any) -> None:
    rt = await cluster.runtime(registry([]))
    key = {"Idempotency-Key": "k1"}
    async with gateway(rt, authorize=allow_all) as http:
        url = "/entities/echo/shared/messages"
        first = await http.post(url, json={"payload": "alice's"}, headers={**AS_ALICE, **key})
        again = await http.post(url, json={"payload": "alice's"}, headers={**AS_ALICE, **key})
        bobs = await http.post(url, json={"payload": "bob's"}, headers={**AS_BOB, **key})
        assert first.json()["event_id"] == again.json()["event_id"]
        assert bobs.json()["event_id"] != first.json()["event_id"]
        bobs_again = await http.post(url, json={"payload": "bob's"}, headers={**AS_BOB, **key})
        assert bobs_again.json()["event_id"] == bobs.json()["event_id"]
    # A caller without an identity keeps the key layout of before, so keys written
    # before this change are still found.
    plain = await rt.send("/echo/shared", "anonymous", idempotency_key="k1")
    assert await rt.send("/echo/shared", "anonymous", idempotency_key="k1") == plain
    keys = rt.store.keys
    assert await rt.store.redis.get(keys.idem("/echo/shared", "k1")) == plain.encode()
    await rt.wait_idle("/echo/shared")
    payloads = [e.payload for e in await log(rt, "/echo/shared") if type(e).__name__ == "Message"]
    assert payloads == ["alice's", "bob's", "anonymous"]


async def test_a_held_message_starts_its_run_when_the_open_run_is_cancelled(
    cluster: Any,
) -> None:
    rt = await cluster.runtime(registry([]))
    await rt.send(VAULT, "forget city", identity=ALICE)
    alices = await suspended_on(rt, VAULT)
    await rt.send(VAULT, "forget pet", identity=BOB)
    assert (await suspended_on(rt, VAULT)).tool_call_id == alices.tool_call_id
    await rt.cancel(VAULT)
    bobs = await suspended_on(rt, VAULT)
    assert bobs.authorized == BOB and bobs.input == {"key": "pet"}


def test_whom_a_wake_acts_for_and_which_inputs_join_the_open_run() -> None:
    def msg(n: int, who: Any) -> LogRecord:
        return LogRecord(f"{n}-0", Message(payload=n, identity=who))

    created = LogRecord("1-0", Created(type="t"))
    settled = LogRecord("5-0", ActionSettled(tool_call_id="c", decision="approved"))
    closed = SystemState()
    # No run open: the first input's identity, or the owner's for anything but a message;
    # the inputs are cut before the first message of another identity.
    split = split_inputs(closed, [created, msg(2, ALICE), msg(3, BOB)], ALICE)
    assert (split.held, [r.id for r in split.taken], split.identity) == ([], ["1-0", "2-0"], ALICE)
    split = split_inputs(closed, [msg(2, None), msg(3, None), msg(4, BOB)], ALICE)
    assert ([r.id for r in split.taken], split.identity) == (["2-0", "3-0"], None)
    # alice's run is open: bob's messages at the head are held, and nothing else runs.
    open_run = SystemState(run="run-1", run_identity=ALICE)
    split = split_inputs(open_run, [msg(2, BOB), msg(3, None), settled, msg(6, ALICE)], ALICE)
    assert ([r.id for r in split.held], split.taken) == (["2-0", "3-0"], [])
    # Behind her own inputs, they wait for the next wake.
    split = split_inputs(open_run, [settled, msg(6, ALICE), msg(7, BOB)], BOB)
    assert (split.held, [r.id for r in split.taken], split.identity) == (
        [],
        ["5-0", "6-0"],
        ALICE,
    )


async def test_held_messages_are_released_when_the_run_fails_after_its_last_retry(
    cluster: Any,
) -> None:
    """The handler finishes alice's run and then raises, every attempt: the run ends as
    failed when the entity is parked, and bob's held message is still sent on."""
    reg = Registry()

    @reg.entity("keeper")
    async def keeper(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.record_run()  # left open: the next message of alice's may finish it
            if m.payload == "finish badly":
                ctx.reply("finished")
                raise RuntimeError("broke after finishing")

    rt = await cluster.runtime(reg, max_attempts=2)
    await rt.send("/keeper/k", "start", identity=ALICE)
    await rt.wait_idle("/keeper/k")
    bobs = await rt.send("/keeper/k", "from bob", identity=BOB)
    await rt.wait_idle("/keeper/k")
    assert [e.input_id for e in await log(rt, "/keeper/k") if isinstance(e, MessageHeld)] == [bobs]
    await rt.send("/keeper/k", "finish badly", identity=ALICE)
    assert (await rt.wait_idle("/keeper/k")).status == "failed"
    events = await log(rt, "/keeper/k")
    [finished] = [e for e in events if isinstance(e, RunFinished)]
    assert finished.status == "failed"
    after = events[events.index(finished) :]
    released = [e for e in after if isinstance(e, Message) and e.identity == BOB]
    assert [m.payload for m in released] == ["from bob"]
