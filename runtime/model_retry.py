"""Waiting out a transient model error on a durable timer.

A model call that still fails after the SDK's own retries with an error that may
pass (HTTP 429, 5xx, 529 overloaded, an ``overloaded_error`` event mid-stream) does
not fail the wake (which would hold the worker in backoff and, after a few attempts,
park the entity). The run journals a :class:`~wakeful.events.ModelRetryWait` and
suspends; a timer (an ``Effect`` with ``due_ms``) wakes the entity with a
:class:`~wakeful.events.ModelRetryDue` when the wait is over, and the run makes the
step again. Meanwhile the worker serves other entities, and the entity takes
cancels and messages (a message joins the open run and does not cut the wait short).

The wait honours the server's ``retry-after``; without one it doubles from
:data:`BASE_WAIT_S` up to :data:`MAX_WAIT_S`. Once the waits of one series would pass
the agent's ``model_retry_total_s``, the run fails with the model's error, and the
entity goes on to its next message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import ModelError
from .events import AssistantStep, ModelRetryDue, ModelRetryWait

__all__ = ["BASE_WAIT_S", "MAX_WAIT_S", "next_wait", "open_wait", "wait_is_over"]

BASE_WAIT_S = 1.0
MAX_WAIT_S = 60.0


def open_wait(run_events: Sequence[Any]) -> ModelRetryWait | None:
    """The run's wait series still open: its last wait, if no step came after it."""
    for event in reversed(run_events):
        if isinstance(event, AssistantStep):
            return None
        if isinstance(event, ModelRetryWait):
            return event
    return None


def wait_is_over(wait: ModelRetryWait, inputs: Sequence[Any], now_ms: int) -> bool:
    """Whether the run may call the model again: its timer fired (the wake has its
    ``ModelRetryDue``: trusted over this machine's clock, which may lag the one that
    fired it), or the due time has passed."""
    fired = any(
        isinstance(event, ModelRetryDue)
        and event.run_id == wait.run_id
        and event.attempt == wait.attempt
        for event in inputs
    )
    return fired or now_ms >= wait.due_ms


def next_wait(
    run_id: str, error: ModelError, previous: ModelRetryWait | None, total_s: float, now_ms: int
) -> ModelRetryWait | None:
    """The wait before the next attempt, or None if it would pass ``total_s`` (counted
    from the first failure of the series): then the run fails."""
    attempt = previous.attempt + 1 if previous is not None else 1
    since_ms = previous.since_ms if previous is not None else now_ms
    if error.retry_after is not None:
        delay_s = error.retry_after
    else:
        delay_s = min(BASE_WAIT_S * 2 ** (attempt - 1), MAX_WAIT_S)
    due_ms = now_ms + int(delay_s * 1000)
    if due_ms - since_ms > total_s * 1000:
        return None
    return ModelRetryWait(
        run_id=run_id,
        attempt=attempt,
        due_ms=due_ms,
        since_ms=since_ms,
        error=str(error),
        retry_after_s=error.retry_after,
    )
