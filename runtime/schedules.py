"""Recurring schedules: a cron expression in a time zone, fired to its own entity.

A schedule belongs to one entity (one incarnation of it) and has an id unique
there. At each occurrence the entity gets a message whose payload is the
schedule's, whose ``sender`` is ``schedule:<id>`` and whose ``idempotency_key``
is the occurrence id ``<id>@<epoch ms of the occurrence>``.

The cron syntax and the occurrence times are croniter's (the pallets-eco
project), in the schedule's IANA time zone (``zoneinfo``); nothing here parses
cron by hand. What happens at daylight-saving changes is croniter's behaviour,
pinned by tests/test_schedules.py:

* a local time that does not exist (spring forward) fires at the first instant
  after the gap: ``30 2 * * *`` in Europe/Berlin fires at 03:00 that day, and
  an hourly expression has no 02:00 occurrence;
* a local time that happens twice (fall back) fires at both instants:
  ``30 2 * * *`` fires at 02:30 CEST and again at 02:30 CET, an hourly
  expression fires at both 02:00. Use ``UTC`` for a schedule that must never
  do either.

The worker side (``schedule_firing.py``) and the Redis side
(``schedule_store.py``, the ``CRON_*`` scripts of ``lua.py``) use this module's
``CronSpec``, the stored form of a schedule, and :func:`next_occurrence_ms`.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
from croniter import CroniterBadDateError, CroniterError, croniter

from .errors import InvalidScheduleError
from .events import Message, encode_event

ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:@-]*"
ID_MAX = 100
MAX_PER_ENTITY = 100
"""At most this many recurring schedules per entity (an agent looping on the upsert
tool cannot fill Redis with them)."""
SENDER_PREFIX = "schedule:"
ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_ID_RE = re.compile(ID_PATTERN)


class CronSpec(msgspec.Struct, frozen=True):
    """A schedule as stored (msgpack, in the entity's schedule hash)."""

    id: str
    expression: str
    timezone: str
    payload: Any
    incarnation: str  # meta.created of the entity it belongs to


@dataclass(frozen=True)
class CronSchedule:
    """A recurring schedule as listed: its next occurrence at ``next_ms`` (epoch ms)."""

    id: str
    expression: str
    timezone: str
    payload: Any
    next_ms: int

    @property
    def next_at(self) -> dt.datetime:
        """The next occurrence, in the schedule's time zone."""
        return dt.datetime.fromtimestamp(self.next_ms / 1000, ZoneInfo(self.timezone))


def check_id(schedule_id: object) -> str:
    if not isinstance(schedule_id, str):
        raise InvalidScheduleError(
            "id", schedule_id, f"must be a string, not {type(schedule_id).__name__}"
        )
    if not 0 < len(schedule_id) <= ID_MAX:
        raise InvalidScheduleError("id", schedule_id, f"must be 1-{ID_MAX} characters long")
    if not _ID_RE.fullmatch(schedule_id):
        raise InvalidScheduleError(
            "id",
            schedule_id,
            "must start with a letter or digit and use only A-Z a-z 0-9 . _ : @ -",
        )
    return schedule_id


def check_timezone(timezone: object) -> ZoneInfo:
    if not isinstance(timezone, str) or not timezone:
        raise InvalidScheduleError("timezone", timezone, "must be an IANA time zone name")
    try:
        return ZoneInfo(timezone)
    except Exception:  # ZoneInfoNotFoundError, ValueError for a path, OSError
        raise InvalidScheduleError(
            "timezone", timezone, "is not an IANA time zone (such as 'UTC' or 'Europe/Berlin')"
        ) from None


def check_expression(expression: object) -> str:
    """The expression, if croniter reads it as a standard 5-field cron expression (or an
    alias such as ``@daily``); croniter's 6th (seconds) and 7th (year) fields are refused,
    so every schedule has a resolution of a minute."""
    if not isinstance(expression, str):
        raise InvalidScheduleError(
            "expression", expression, f"must be a string, not {type(expression).__name__}"
        )
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise InvalidScheduleError(
                "expression", expression, f"is not one of {', '.join(sorted(ALIASES))}"
            )
    elif len(text.split(" ")) != 5:
        raise InvalidScheduleError(
            "expression",
            expression,
            "must have 5 fields: minute hour day-of-month month day-of-week (e.g. '0 9 * * 1-5')",
        )
    try:
        croniter(text)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidScheduleError(
            "expression", expression, str(exc) or type(exc).__name__
        ) from None
    return text


def next_occurrence_ms(expression: str, timezone: str, after_ms: int) -> int:
    """The first occurrence strictly after ``after_ms`` (epoch ms), in ``timezone``."""
    zone = check_timezone(timezone)
    start = dt.datetime.fromtimestamp(after_ms / 1000, zone)
    try:
        due = croniter(expression, start).get_next(dt.datetime)
    except CroniterBadDateError:
        raise InvalidScheduleError(
            "expression", expression, "never matches a date (such as February 30th)"
        ) from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidScheduleError(
            "expression", expression, str(exc) or type(exc).__name__
        ) from None
    return int(due.timestamp() * 1000)


def make_spec(
    schedule_id: object,
    expression: object,
    timezone: object,
    payload: Any,
    incarnation: str,
    *,
    limit: int,
    now_ms: int,
) -> tuple[CronSpec, bytes, int]:
    """Check a schedule (id, expression, zone, payload) and return it with its stored
    bytes and its first occurrence after ``now_ms``; raises InvalidScheduleError (or the
    payload errors of ``encode_event``) naming what is wrong, before anything is written."""
    check_id(schedule_id)
    text = check_expression(expression)
    check_timezone(timezone)
    assert isinstance(schedule_id, str) and isinstance(timezone, str)
    first_ms = next_occurrence_ms(text, timezone, now_ms)
    try:
        clean = msgspec.to_builtins(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidScheduleError(
            "payload", payload, f"cannot be sent as a message: {exc}"
        ) from None
    spec = CronSpec(schedule_id, text, timezone, clean, incarnation)
    occurrence_event(spec, first_ms, limit=limit)  # the payload must fit in a message
    return spec, msgspec.msgpack.encode(spec), first_ms


def decode_spec(data: bytes) -> CronSpec:
    """A stored schedule; raises msgspec.DecodeError / ValidationError if it is not one."""
    return msgspec.msgpack.decode(data, type=CronSpec)


def occurrence_id(schedule_id: str, due_ms: int) -> str:
    return f"{schedule_id}@{due_ms}"


def occurrence_event(spec: CronSpec, due_ms: int, *, limit: int) -> bytes:
    """The message an occurrence appends to the entity's log."""
    message = Message(
        payload=spec.payload,
        sender=f"{SENDER_PREFIX}{spec.id}",
        idempotency_key=occurrence_id(spec.id, due_ms),
    )
    return encode_event(message, limit=limit, what=f"the payload of schedule {spec.id!r}")


def listed(spec: CronSpec, next_ms: int) -> CronSchedule:
    return CronSchedule(spec.id, spec.expression, spec.timezone, spec.payload, next_ms)
