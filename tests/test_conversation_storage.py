"""The conversation stored in sealed chunks: a snapshot references them and keeps only
the open tail, so snapshot bytes per commit stay flat however long the conversation.

Each check reads the state back three ways and compares it with a fold of the whole
log from nothing (the reference): the worker's warm state, a cold load by a worker
(cache cleared: snapshot + chunks + log tail) and the client's ``rt.state`` /
``rt.history`` (the same LOAD script).
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from tests.faults import crash_and_recover
from wakeful import AgentTool, HandlerContext, Registry, ScriptedModel, ToolResult
from wakeful.compaction import SUMMARY_SYSTEM
from wakeful.errors import ConversationChunkError, FencedError
from wakeful.events import ConversationCompacted
from wakeful.fold import rebuild
from wakeful.gateway import bearer_tokens, create_app
from wakeful.models import ModelRequest, ModelResponse
from wakeful.state import CHUNK_EVENTS, EntityState, Snapshot, chunk_field
from wakeful.store import Store

pytestmark = pytest.mark.anyio

URL = "/agent/long"


async def echo(call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
    return ToolResult(params["text"])


ECHO = AgentTool(
    "echo",
    "Echoes its text.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    echo,
)


def respond(request: ModelRequest) -> ModelResponse:
    """One tool call per run, then a text; a summary when asked for one."""
    if request.system == SUMMARY_SYSTEM:
        return ScriptedModel.text("SUMMARY of the talk so far.")
    last = request.messages[-1]["content"]
    if any(block.get("type") == "tool_result" for block in last):
        return ScriptedModel.text("Done: the tool echoed it.")
    return ScriptedModel.tool_calls(("echo", {"text": "ping " * 20}))


def agent_app() -> Registry:
    reg = Registry()
    model = ScriptedModel(respond, name="scripted")

    @reg.entity("agent")
    async def agent(ctx: HandlerContext) -> None:
        ctx.use_agent(system_prompt="You echo.", model=model, tools=[ECHO])
        await ctx.agent.run()

    return reg


class Commits:
    """What each snapshot-writing commit of ``URL`` wrote (a wrapper of Store.commit)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.snapshots: list[int] = []  # snapshot bytes
        self.written: list[int] = []  # snapshot + new chunk bytes
        self.drops: list[list[str]] = []
        original = Store.commit

        async def commit(store: Store, url: str, token: str, **kwargs: Any) -> list[str]:
            ids = await original(store, url, token, **kwargs)
            if url == URL and kwargs.get("snapshot"):
                chunks = kwargs.get("chunks", ())
                self.snapshots.append(len(kwargs["snapshot"]))
                self.written.append(len(kwargs["snapshot"]) + sum(len(c) for _, c in chunks))
                self.drops.append(list(kwargs.get("drop_chunks", ())))
            return ids

        monkeypatch.setattr(Store, "commit", commit)


def encoded(state: EntityState) -> bytes:
    return msgspec.msgpack.encode(state.system)


async def reference(rt: Any, url: str = URL) -> EntityState:
    """The state folded from the whole log, from nothing (no snapshot, no chunk)."""
    entries = await rt.store.read_log(url, count=1_000_000)
    meta = await rt.store.entity_meta(url)
    return rebuild(url, EntityState({}), entries, meta.cursor).state


async def conv_fields(rt: Any, url: str = URL) -> set[str]:
    return {f.decode() for f in await rt.store.redis.hkeys(rt.store.keys.conv(url))}


async def snapshot_of(rt: Any, url: str = URL) -> Snapshot:
    data = await rt.store.snapshot(url)
    assert data is not None
    return msgspec.msgpack.decode(data, type=Snapshot)


async def check_everywhere(rt: Any, url: str = URL) -> EntityState:
    """The worker's warm state, a worker's cold load and the client's fold all equal
    the reference fold of the whole log; the conversation hash holds exactly the chunks
    the snapshot references."""
    ref = await reference(rt, url)
    cached = rt.worker.cache.get(url)
    if cached is not None:
        assert encoded(cached.state) == encoded(ref)
    assert encoded(await rt._folded(url)) == encoded(ref)  # rt.state / rt.history's fold
    assert msgspec.msgpack.encode(await rt.history(url)) == msgspec.msgpack.encode(
        ref.system.history
    )
    snap = await snapshot_of(rt, url)
    expected = (
        {chunk_field(snap.conv.gen, k) for k in range(snap.conv.chunks)} if snap.conv else set()
    )
    assert await conv_fields(rt, url) == expected
    return ref


async def converse(rt: Any, turns: int, start: int = 0) -> None:
    for n in range(start, start + turns):
        assert await rt.ask(URL, f"turn {n}", timeout=30) == "Done: the tool echoed it."


async def cold_turn(rt: Any, n: int) -> None:
    """One more turn on a worker that forgot the entity: it loads snapshot + chunks."""
    rt.worker.cache.forget(URL)
    await converse(rt, 1, n)


async def test_snapshot_bytes_per_commit_stay_bounded_in_a_long_conversation(cluster, monkeypatch):
    commits = Commits(monkeypatch)
    rt = await cluster.runtime(agent_app(), snapshot_every=20)
    turns = 240
    await converse(rt, turns)
    ref = await check_everywhere(rt)
    events = len(ref.system.history)
    assert events >= 5 * turns  # user turn, step, intent, result, step per turn
    snap = await snapshot_of(rt)
    assert snap.conv is not None and snap.conv.chunks == events // CHUNK_EVENTS
    assert len(snap.system.history) < CHUNK_EVENTS  # only the open tail is inline
    # Once chunks are sealed, a snapshot holds only a tail: the last quarter of the
    # snapshots is no larger than the early ones, though the conversation is 4x longer.
    first_chunked = next(i for i, d in enumerate(commits.written) if d > commits.snapshots[i])
    sizes = commits.snapshots[first_chunked:]
    quarter = max(1, len(sizes) // 4)
    assert max(sizes[-quarter:]) <= 1.2 * max(sizes[:quarter])
    written = commits.written[first_chunked:]
    assert max(written[-quarter:]) <= 1.2 * max(written[:quarter])
    stored = sum(len(v) for v in (await rt.store.redis.hgetall(rt.store.keys.conv(URL))).values())
    assert max(commits.snapshots) < stored / 4  # the conversation is mostly in chunks
    # Every chunk is written once: what the snapshots wrote is the chunks plus the tails.
    assert sum(commits.written) - sum(commits.snapshots) == stored
    # A worker that forgot the entity loads snapshot + chunks and goes on from there.
    await cold_turn(rt, turns)
    await check_everywhere(rt)


async def test_compaction_and_reset_start_a_new_sequence_and_drop_the_old_chunks(
    cluster, monkeypatch
):
    commits = Commits(monkeypatch)
    rt = await cluster.runtime(agent_app(), snapshot_every=5)
    await converse(rt, 40)
    before = await conv_fields(rt)
    assert before and all(f.startswith("0:") for f in before)
    assert await rt.compact(URL) is True
    await converse(rt, 2, 40)  # a wake that writes a snapshot after the compaction
    ref = await check_everywhere(rt)
    assert isinstance(ref.system.history[0], ConversationCompacted)
    assert ref.system.conv_gen == 1
    assert not (await conv_fields(rt)) & before  # the old sequence is gone
    assert any(set(drop) == before for drop in commits.drops)
    await converse(rt, 30, 42)  # long enough to seal chunks of the new sequence
    assert {f.split(":")[0] for f in await conv_fields(rt)} == {"1"}
    await cold_turn(rt, 72)
    await check_everywhere(rt)
    assert await rt.reset_conversation(URL) is True
    await converse(rt, 1, 73)
    ref = await check_everywhere(rt)
    assert ref.system.conv_gen == 2
    assert await conv_fields(rt) == set()  # a fresh conversation has no sealed chunk yet
    await cold_turn(rt, 74)
    await check_everywhere(rt)


async def test_an_old_snapshot_with_the_conversation_inline_still_loads(cluster, monkeypatch):
    rt = await cluster.runtime(agent_app(), snapshot_every=5)
    await converse(rt, 30)
    # Rewrite the snapshot as the version before chunks wrote it: no `conv`, no
    # `conv_gen`, the whole conversation inline, and no conversation hash.
    state = await reference(rt)
    system = msgspec.to_builtins(state.system)
    del system["conv_gen"]
    old = msgspec.msgpack.encode({"v": 1, "rows": {}, "system": system})
    await rt.store.redis.delete(rt.store.keys.conv(URL))
    await rt.store.redis.set(rt.store.keys.snap(URL), old)
    await rt.store.redis.hset(
        rt.store.keys.meta(URL), mapping={"snap_upto": (await rt.store.read_log(URL))[-1][0]}
    )
    loaded = await rt._folded(URL)
    assert encoded(loaded) == encoded(state)
    # A worker loads it cold and its next snapshot seals the conversation in chunks.
    await cold_turn(rt, 30)
    await converse(rt, 2, 31)
    await check_everywhere(rt)
    assert (await snapshot_of(rt)).conv is not None


async def test_a_missing_chunk_is_named_not_guessed(cluster):
    rt = await cluster.runtime(agent_app(), snapshot_every=5)
    await converse(rt, 20)
    snap = await snapshot_of(rt)
    assert snap.conv is not None
    await rt.store.redis.hdel(rt.store.keys.conv(URL), chunk_field(snap.conv.gen, 0))
    with pytest.raises(ConversationChunkError, match=r"/agent/long.*chunk 0:0, which is missing"):
        await rt.history(URL)
    # A worker that must load it cold parks the entity with the same reason, rather
    # than run the agent on a conversation with a hole in it.
    rt.worker.cache.forget(URL)
    await rt.send(URL, "one more")
    status = await rt.wait_idle(URL)
    assert status.status == "failed"
    assert "chunk 0:0, which is missing" in (status.error or "")


@pytest.mark.parametrize("point", ["snapshot:before-commit", "snapshot:after-commit"])
async def test_a_crash_around_the_chunk_write_recovers_the_same_state(cluster, point):
    app = agent_app()

    async def setup(first: Any) -> None:
        # Long enough that the next snapshot seals a new chunk.
        await converse(first, 13)

    cluster_settings = cluster.settings
    cluster.settings = lambda **kw: cluster_settings(**{"snapshot_every": 10, **kw})
    rt = await crash_and_recover(cluster, app, URL, "after the crash", point, 1, setup=setup)
    await check_everywhere(rt)
    await cold_turn(rt, 100)
    await check_everywhere(rt)


@pytest.mark.parametrize("point", ["snapshot:before-commit", "snapshot:after-commit"])
async def test_a_crash_around_the_snapshot_that_drops_old_chunks(cluster, point):
    app = agent_app()

    async def setup(first: Any) -> None:
        await converse(first, 20)
        assert await conv_fields(first)

    async def trigger(first: Any) -> None:
        await first.reset_conversation(URL, wait=False)

    cluster_settings = cluster.settings
    cluster.settings = lambda **kw: cluster_settings(**{"snapshot_every": 1, **kw})
    rt = await crash_and_recover(cluster, app, URL, None, point, 1, setup=setup, trigger=trigger)
    ref = await check_everywhere(rt)
    assert ref.system.conv_gen == 1
    assert [type(e) for e in ref.system.history] == [ConversationCompacted]
    await converse(rt, 1, 20)
    assert await conv_fields(rt) == set()  # the old chunks went with the reset's snapshot
    await check_everywhere(rt)


async def test_a_zombies_commit_writes_no_chunk(cluster):
    rt = await cluster.runtime(agent_app(), snapshot_every=5)
    await converse(rt, 20)
    before = await rt.store.redis.hgetall(rt.store.keys.conv(URL))
    snap_before = await rt.store.snapshot(URL)
    with pytest.raises(FencedError):
        await rt.store.commit(
            URL,
            "zombie:1",
            snapshot=b"SNAP",
            chunks=[("9:0", b"CHUNK")],
            drop_chunks=list(f.decode() for f in before),
        )
    assert await rt.store.redis.hgetall(rt.store.keys.conv(URL)) == before
    assert await rt.store.snapshot(URL) == snap_before
    await check_everywhere(rt)


async def test_deleting_the_entity_deletes_its_chunks(cluster):
    rt = await cluster.runtime(agent_app(), snapshot_every=5)
    await converse(rt, 20)
    assert await conv_fields(rt)
    await rt.delete(URL)  # waits until the metadata is gone
    assert not await rt.store.redis.exists(rt.store.keys.conv(URL))


# -- compact and reset over HTTP -------------------------------------------------------

TOKENS = {"t-alice": {"user": "alice"}, "t-bob": {"user": "bob"}}
ALICE = {"authorization": "Bearer t-alice"}
BOB = {"authorization": "Bearer t-bob"}


async def test_compact_and_reset_over_http_are_authorised_writes(cluster):
    rt = await cluster.runtime(agent_app(), snapshot_every=5)
    app = create_app(rt, authenticate=bearer_tokens(TOKENS))  # the owner policy
    base = "/entities/agent/long"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as http:
        await http.post(base, json={}, headers=ALICE)  # alice creates, so owns, it
        for n in range(6):
            await http.post(f"{base}/messages", json={"payload": f"turn {n}"}, headers=ALICE)
            await rt.wait_idle(URL)
        before = await rt.history(URL)
        # Another identity may not, nor may an anonymous caller, nor for a missing entity.
        assert (await http.post(f"{base}/compact", json={}, headers=BOB)).status_code == 403
        assert (await http.post(f"{base}/reset", json={})).status_code == 401
        missing = await http.post("/entities/agent/none/compact", json={}, headers=ALICE)
        assert missing.status_code in (403, 404)
        bad = await http.post(f"{base}/compact", json={"wait": "yes"}, headers=ALICE)
        assert bad.status_code == 400 and "wait" in bad.json()["error"]["message"]
        await rt.wait_idle(URL)
        assert await rt.history(URL) == before  # nothing was asked of the entity
        compacted = await http.post(f"{base}/compact", json={"wait": True}, headers=ALICE)
        assert compacted.status_code == 200, compacted.text
        assert compacted.json() == {"url": URL, "compacted": True}
        history = await rt.history(URL)
        assert isinstance(history[0], ConversationCompacted) and history[0].mode == "compact"
        # Without wait it is only requested (202); the entity resets when it wakes.
        requested = await http.post(f"{base}/reset", headers=ALICE | JSON)
        assert requested.status_code == 202
        assert requested.json() == {"url": URL, "requested": "reset"}
        await rt.wait_idle(URL)
        assert await rt.conversation(URL) == []
        again = await http.post(f"{base}/reset", json={"wait": True}, headers=ALICE)
        assert again.json() == {"url": URL, "reset": False}  # nothing left to drop
        await check_everywhere(rt)
        spec = (await http.get("/openapi.json")).json()["paths"]
        for action in ("compact", "reset"):
            op = spec[f"/entities/{{type}}/{{id}}/{action}"]["post"]
            assert {"200", "202", "403", "404", "504"} <= set(op["responses"])


JSON = {"content-type": "application/json"}
