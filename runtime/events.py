"""The events of an entity log.

Every entry of an entity log is one event: a msgspec Struct from the tagged
union :data:`AnyEvent`, msgpack-encoded under the stream field ``e``. The tag
(``t``) names the kind; ``v`` is the schema version of that kind. New fields are
added with defaults so older entries keep decoding; a kind whose meaning changes
gets a new ``v`` and the decoder upgrades old versions.

Events are either *inputs* (they wake the entity: ``created``, ``msg``) or
*outputs* written by the entity's own fenced commits (``state``,
``handler_error``, ``failed``, ``resumed``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from .errors import EventDecodeError, InvalidPayloadError, PayloadTooLargeError

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024


class Event(msgspec.Struct, tag_field="t", kw_only=True, omit_defaults=True):
    """Base of all log events."""

    is_input: ClassVar[bool] = False
    v: int = 1


# --- inputs -----------------------------------------------------------------


class Created(Event, tag="created"):
    """The entity was created (first event of every log)."""

    is_input: ClassVar[bool] = True
    type: str
    args: Any = None
    parent: str | None = None


class Message(Event, tag="msg"):
    """A message sent to the entity by a client or another entity.

    ``identity`` is set by a trusted caller (the gateway's authentication, a
    parent entity); ``client_data`` travels with the message and is untrusted.
    """

    is_input: ClassVar[bool] = True
    payload: Any = None
    sender: str | None = None
    identity: dict[str, str] | None = None
    client_data: Any = None
    idempotency_key: str | None = None


class Resumed(Event, tag="resumed"):
    """An operator resumed a failed entity (``skipped`` lists dead-lettered inputs).

    Not an input: the resumed wake sees the inputs that were left unprocessed."""

    skipped: list[str] = []


# --- outputs ----------------------------------------------------------------


class Op(msgspec.Struct, array_like=True):
    """One durable collection write. ``row`` is the msgpack-encoded row (nil for delete)."""

    op: Literal["insert", "update", "delete"]
    collection: str
    key: Any
    row: msgspec.Raw = msgspec.Raw(b"\xc0")


class StateChanged(Event, tag="state"):
    ops: list[Op]


class HandlerFailed(Event, tag="handler_error"):
    """The handler raised; the inputs stay unprocessed and will be retried."""

    error_type: str
    error: str
    traceback: str
    attempt: int
    inputs: list[str]


class EntityFailed(Event, tag="failed"):
    """Retries are exhausted (or an input could not be decoded); the entity is parked."""

    error: str
    attempts: int
    inputs: list[str]


AnyEvent = Created | Message | Resumed | StateChanged | HandlerFailed | EntityFailed

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyEvent)


class LogRecord(msgspec.Struct, frozen=True):
    """An event together with its stream id (its position in the entity log)."""

    id: str
    event: Event


class UndecodableRecord(msgspec.Struct, frozen=True):
    """A log entry that failed to decode, reported instead of skipped."""

    id: str
    error: str
    raw: bytes


def encode_event(event: Event, *, limit: int = DEFAULT_MAX_EVENT_BYTES, what: str = "event") -> bytes:
    try:
        data = _encoder.encode(event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidPayloadError(f"{what} cannot be encoded as msgpack: {exc}") from exc
    if len(data) > limit:
        raise PayloadTooLargeError(what, len(data), limit)
    return data


def decode_event(data: bytes, *, stream_id: str = "?", url: str = "?") -> Event:
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EventDecodeError(stream_id, url, str(exc)) from exc


def decode_entry(stream_id: str, fields: dict[bytes, bytes], url: str) -> LogRecord:
    data = fields.get(b"e")
    if data is None:
        raise EventDecodeError(stream_id, url, "stream entry has no 'e' field")
    return LogRecord(stream_id, decode_event(data, stream_id=stream_id, url=url))


def pack(value: Any) -> bytes:
    return _encoder.encode(value)


def unpack(data: bytes) -> Any:
    return msgspec.msgpack.decode(data)
