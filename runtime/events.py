"""Writing and reading the events of an entity log: encoding, decoding, records.

Every entry of an entity log is one event of :data:`AnyEvent` (the kinds are
defined in ``event_types.py`` and re-exported here, where the runtime imports
them from), msgpack-encoded under the stream field ``e``. This module encodes an
event within its size limit (checked to decode back, a client's payload checked
as JSON), decodes an entry into a :class:`LogRecord` (or says why it cannot), and
gives a client its view of an event (:func:`client_view`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .errors import EventDecodeError, InvalidEventError, InvalidPayloadError, PayloadTooLargeError
from .event_types import *  # noqa: F403  (the event kinds, re-exported: import them from here)
from .event_types import AnyEvent, Event, HandlerFailed, RuntimeErrorRecorded
from .json_values import MAX_JSON_DEPTH, check_json_value, may_be_loose

# The default of Settings.max_event_bytes (config.py imports it: events sit below config).
DEFAULT_MAX_EVENT_BYTES = 1024 * 1024

RUNTIME_EVENT_MAX_BYTES = 1 << 30
"""Size limit for the events the runtime writes itself (Created, failures, notices,
state changes, timer events, Resumed). ``Settings.max_event_bytes`` limits what
clients and handlers send; an event the runtime derives from accepted data must
not be refused later, so its limit (1 GiB) is above Redis' own 512 MB value limit:
in effect, none of Wakeful's."""


OPERATOR_ONLY: tuple[type[Event], ...] = (RuntimeErrorRecorded,)
"""Kinds of events the gateway (every HTTP identity, the SSE stream) never sends."""


def client_view(event: Event) -> Event | None:
    """``event`` as the gateway may send it to a client: None for an operator-only kind,
    and a handler's failure without its traceback (the code's internals and whatever
    its frames printed stay with operators: ``wakeful tail``, the worker log)."""
    if isinstance(event, OPERATOR_ONLY):
        return None
    if isinstance(event, HandlerFailed) and event.traceback:
        return msgspec.structs.replace(event, traceback="")
    return event


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


class TrimmedRecord(msgspec.Struct, frozen=True):
    """A reader asked for history that log retention trimmed: every entry up to and
    including ``id`` is gone from Redis (an exporter may hold it, see retention.py).
    The records after this one continue after ``id``; ``after`` is where the reader was.
    Never stored: readers yield it in place of the missing range, never a silent jump."""

    id: str
    after: str

    @property
    def message(self) -> str:
        return f"history up to {self.id} was trimmed (log retention); continuing after it"


def encode_event(
    event: Event,
    *,
    limit: int = DEFAULT_MAX_EVENT_BYTES,
    what: str = "event",
    from_client: bool = False,
) -> bytes:
    """Encode ``event`` for the log, refusing what could not be read back.

    msgspec does not check a Struct's field types on construction, so an event
    built from untrusted input (``CancelRequested(reason=12345)``) would encode
    fine and then park its entity when the worker decodes it. Every append goes
    through here, so the encoded bytes are decoded with the reader's own decoder
    first (about a microsecond per event): nothing undecodable is ever written.

    ``from_client``: the event carries values from outside the runtime (a
    client's message, args or answer), which must also be JSON the API can
    carry back out (see :func:`check_json_value`). Events the runtime derives
    itself are not refused for that: their readers render what JSON cannot
    carry as ``null``.
    """
    try:
        data = _encoder.encode(event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidPayloadError(f"{what} cannot be encoded as msgpack: {exc}") from exc
    except RecursionError:
        raise InvalidPayloadError(
            f"{what} is nested deeper than {MAX_JSON_DEPTH} levels of lists and maps"
        ) from None
    if len(data) > limit:
        raise PayloadTooLargeError(what, len(data), limit)
    try:
        _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _invalid(event, what, str(exc)) from None
    if from_client and may_be_loose(data):
        # The event's own map is one level: its fields may nest MAX_JSON_DEPTH more.
        check_json_value(msgspec.msgpack.decode(data), what, max_depth=MAX_JSON_DEPTH + 1)
    return data


_AT = re.compile(r"^(.*?)(?: - at `\$\.?(.*)`)?$", re.DOTALL)


def _invalid(event: Event, what: str, error: str) -> InvalidEventError:
    """``Expected `str`, got `int` - at `$.reason``` -> an error naming the field."""
    match = _AT.match(error)
    problem, field = (match.group(1), match.group(2) or "") if match else (error, "")
    tag = type(event).__struct_config__.tag
    where = f"field {field!r} of the {tag!r} event" if field else f"the {tag!r} event"
    return InvalidEventError(f"{what}: {where} is invalid: {problem}", field)


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


_canonical_encoder = msgspec.msgpack.Encoder(order="sorted")


def pack(value: Any) -> bytes:
    """Canonical encoding (map keys sorted): equal args always compare equal as bytes."""
    return _canonical_encoder.encode(value)


def unpack(data: bytes) -> Any:
    return msgspec.msgpack.decode(data)


def plain(value: Any) -> Any:
    """Events and structs as JSON-ready builtins, for every printer and API: the stored
    rows they carry (``msgspec.Raw`` msgpack, as in ``changed`` events) are decoded."""
    return msgspec.to_builtins(value, enc_hook=_stored_row)


def _stored_row(value: Any) -> Any:
    if isinstance(value, msgspec.Raw):
        return msgspec.msgpack.decode(value)
    raise TypeError(f"cannot encode {type(value).__name__}")
