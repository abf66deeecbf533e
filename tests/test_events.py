"""Log events: encoding, decoding, size limits and bad payloads."""

from __future__ import annotations

import msgspec
import pytest

from wakeful import (
    ChildRunFinished,
    Created,
    EntityFailed,
    EntityNotFoundError,
    EventDecodeError,
    HandlerContext,
    HandlerFailed,
    InvalidPayloadError,
    Message,
    PayloadTooLargeError,
    Registry,
    Resumed,
    RunFinished,
    StateChanged,
)
from wakeful.events import (
    DEFAULT_MAX_EVENT_BYTES,
    LogRecord,
    Op,
    decode_entry,
    decode_event,
    encode_event,
    pack,
    unpack,
)

pytestmark = pytest.mark.anyio


def _row(value: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.msgpack.encode(value))


EVENTS = [
    Created(type="assistant"),
    Created(type="researcher", args={"topic": "bees", "depth": 2}, parent="/assistant/alice"),
    Message(),
    Message(payload="hi"),
    Message(
        payload={"text": "hello", "n": [1, 2.5, None, True]},
        sender="/assistant/bob",
        identity={"user": "u1", "org": "o"},
        client_data={"tab": 3},
        idempotency_key="k-1",
    ),
    Resumed(),
    Resumed(skipped=["1-0", "2-5"]),
    StateChanged(ops=[]),
    StateChanged(
        ops=[
            Op("insert", "kv", "a", _row({"key": "a", "value": "x"})),
            Op("update", "kv", 7, _row({"key": 7, "value": "y"})),
            Op("delete", "kv", "b"),
        ]
    ),
    HandlerFailed(
        error_type="ValueError",
        error="boom",
        traceback="Traceback ...",
        attempt=2,
        inputs=["1-0", "1-1"],
    ),
    EntityFailed(error="ValueError: boom", attempts=5, inputs=["1-1"]),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_kind_roundtrips(event) -> None:
    data = encode_event(event)
    decoded = decode_event(data)
    assert type(decoded) is type(event)
    assert decoded == event
    assert decoded.v == 1
    # Stable tag on the wire.
    tag = type(event).__struct_config__.tag
    assert unpack(data)["t"] == tag


def test_state_ops_keep_their_row_bytes() -> None:
    event = EVENTS[8]
    decoded = decode_event(encode_event(event))
    assert [(o.op, o.collection, o.key) for o in decoded.ops] == [
        ("insert", "kv", "a"),
        ("update", "kv", 7),
        ("delete", "kv", "b"),
    ]
    assert msgspec.msgpack.decode(bytes(decoded.ops[0].row)) == {"key": "a", "value": "x"}
    assert msgspec.msgpack.decode(bytes(decoded.ops[1].row)) == {"key": 7, "value": "y"}
    assert bytes(decoded.ops[2].row) == b"\xc0"  # nil for a delete


def test_input_and_output_kinds() -> None:
    assert Created.is_input and Message.is_input
    assert not Resumed.is_input
    assert not StateChanged.is_input
    assert not HandlerFailed.is_input
    assert not EntityFailed.is_input


def test_defaults_are_omitted_on_the_wire() -> None:
    assert unpack(encode_event(Message(payload="x"))) == {"t": "msg", "payload": "x"}


def test_older_entries_with_unknown_fields_still_decode() -> None:
    # A newer writer may add fields; older readers ignore them.
    data = pack({"t": "msg", "payload": "x", "future_field": 1})
    assert decode_event(data) == Message(payload="x")


# A run's end as written before RunFinished and ChildRunFinished shared their fields
# (RunEnd): the same keys, in the order the old Structs wrote them.
_OLD_RUN_FINISHED = {
    "t": "run_finished",
    "run_id": "r1",
    "status": "refused",
    "response": "no",
    "error": "e",
    "usage": {"input_tokens": 3},
    "steps": 2,
    "tool_calls": 1,
    "at_ms": 5,
    "stop_reason": "refusal",
    "stop_sequence": "STOP",
    "stop_details": {"category": "cyber"},
    "output": {"n": 1},
    "output_type": "Answer",
    "trace": {"traceparent": "00-x"},
}
_OLD_CHILD_RUN_FINISHED = {
    "t": "child_run_finished",
    "child": "/researcher/r",
    "run_id": "r1",
    "status": "completed",
    "response": "ok",
    "stop_reason": "end_turn",
    "output": [1],
    "output_type": "Answer",
}


@pytest.mark.parametrize(
    ("entry", "kind"),
    [(_OLD_RUN_FINISHED, RunFinished), (_OLD_CHILD_RUN_FINISHED, ChildRunFinished)],
    ids=["run_finished", "child_run_finished"],
)
def test_a_run_end_written_before_its_fields_were_shared_decodes_to_the_same_event(
    entry: dict[str, object], kind: type
) -> None:
    decoded = decode_event(msgspec.msgpack.encode(entry))  # keys in the order given
    assert type(decoded) is kind
    assert {name: getattr(decoded, name) for name in entry if name != "t"} == {
        name: value for name, value in entry.items() if name != "t"
    }
    # And it writes back the same keys and values (a map: the order is not read).
    assert unpack(encode_event(decoded)) == entry


def test_size_limit_on_encode() -> None:
    event = Message(payload="x" * 100)
    size = len(encode_event(event))
    assert encode_event(event, limit=size) == encode_event(event)
    with pytest.raises(PayloadTooLargeError) as info:
        encode_event(event, limit=size - 1, what="message to /a/b")
    assert info.value.size == size
    assert info.value.limit == size - 1
    assert str(info.value) == f"message to /a/b is {size} bytes, over the limit of {size - 1} bytes"
    # The default limit is 1 MiB.
    with pytest.raises(PayloadTooLargeError):
        encode_event(Message(payload=b"x" * DEFAULT_MAX_EVENT_BYTES))


@pytest.mark.parametrize(
    "payload", [object(), complex(1, 2), 2**70, {"nested": [1, {2, object()}]}], ids=repr
)
def test_unencodable_payload(payload: object) -> None:
    with pytest.raises(InvalidPayloadError, match="cannot be encoded as msgpack"):
        encode_event(Message(payload=payload), what="message to /a/b")
    assert issubclass(InvalidPayloadError, TypeError)


@pytest.mark.parametrize(
    ("data", "reason_fragment"),
    [
        (b"", "Input data was truncated"),
        (b"\xc1", "invalid"),
        (b"not msgpack at all", ""),
        (pack({"t": "no-such-kind"}), "Invalid value 'no-such-kind'"),
        (pack({"payload": "no tag"}), "Object missing required field `t`"),
        (pack({"t": "created"}), "Object missing required field `type`"),
        (pack({"t": "handler_error", "error": 1}), "Expected `str`, got `int`"),
        (pack([1, 2, 3]), "Expected `object`, got `array`"),
    ],
)
def test_decode_garbage_raises_with_stream_id(data: bytes, reason_fragment: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_event(data, stream_id="1700000000000-3", url="/assistant/alice")
    err = info.value
    assert err.stream_id == "1700000000000-3"
    assert err.url == "/assistant/alice"
    assert reason_fragment.lower() in err.reason.lower()
    assert "1700000000000-3" in str(err)
    assert "/assistant/alice" in str(err)


def test_decode_entry() -> None:
    data = encode_event(Message(payload="hi"))
    record = decode_entry("5-1", {b"e": data}, "/a/b")
    assert record == LogRecord("5-1", Message(payload="hi"))
    with pytest.raises(EventDecodeError) as info:
        decode_entry("5-2", {b"x": data}, "/a/b")
    assert info.value.stream_id == "5-2"
    assert "no 'e' field" in info.value.reason
    with pytest.raises(EventDecodeError) as info:
        decode_entry("5-3", {b"e": b"\xff\xfe"}, "/a/b")
    assert info.value.stream_id == "5-3"


# --- at the sender ------------------------------------------------------------


def _registry(seen: list[object]) -> Registry:
    reg = Registry()

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        seen.extend(m.payload for m in ctx.wake.messages)

    return reg


async def _log_len(rt, url: str) -> int:
    return await rt.store.redis.xlen(rt.store.keys.log(url))


async def test_oversized_message_is_refused_at_send_and_nothing_is_appended(cluster) -> None:
    seen: list[object] = []
    rt = await cluster.runtime(_registry(seen), max_event_bytes=1000)
    url = "/echo/big"

    # A new entity: refused before anything exists.
    with pytest.raises(PayloadTooLargeError) as info:
        await rt.send(url, "x" * 2000, idempotency_key="k")
    assert info.value.limit == 1000
    assert info.value.size > 2000
    assert url in str(info.value)
    assert await _log_len(rt, url) == 0
    with pytest.raises(EntityNotFoundError):
        await rt.status(url)

    # An existing entity: its log does not grow.
    await rt.send(url, "small")
    await rt.wait_idle(url, timeout=10)
    before = await _log_len(rt, url)
    with pytest.raises(PayloadTooLargeError):
        await rt.send(url, {"blob": "y" * 5000})
    assert await _log_len(rt, url) == before

    # The refused send did not burn its idempotency key.
    await rt.send(url, "retry-small", idempotency_key="k")
    await rt.wait_idle(url, timeout=10)
    assert seen == ["small", "retry-small"]
    messages = [r.event.payload async for r in rt.events(url) if isinstance(r.event, Message)]
    assert messages == ["small", "retry-small"]


async def test_oversized_create_is_refused(cluster) -> None:
    rt = await cluster.runtime(_registry([]), max_event_bytes=500)
    with pytest.raises(PayloadTooLargeError):
        await rt.create("echo", "a", {"big": "z" * 1000})
    with pytest.raises(PayloadTooLargeError):
        await rt.create("echo", "b", initial_message="z" * 1000)
    for url in ("/echo/a", "/echo/b"):
        assert await _log_len(rt, url) == 0
    assert await rt.list("echo") == []


async def test_unencodable_payload_is_refused_at_send(cluster) -> None:
    rt = await cluster.runtime(_registry([]))
    url = "/echo/bad"
    with pytest.raises(InvalidPayloadError):
        await rt.send(url, {"when": object()})
    with pytest.raises(InvalidPayloadError):
        await rt.send(url, "ok", client_data=complex(0, 1))
    assert await _log_len(rt, url) == 0
    with pytest.raises(EntityNotFoundError):
        await rt.status(url)
