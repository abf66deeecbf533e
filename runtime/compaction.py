"""Context management of the agent loop: keep the conversation inside the model's
context window.

The journal (``SystemState.history``) only grows, but what is sent to the model
need not: a :class:`~wakeful.events.ConversationCompacted` event replaces the
oldest events of the journal in the folded state (the log keeps them all), and
the projection starts from it. :class:`ContextKeeper` decides when and where:

* before each model request it estimates the request's size (see
  ``context_window.py``); past the policy's limit it shortens the conversation;
* a request the API refuses as too long shortens it too (by force), and the
  step is tried once more;
* ``compact`` asks the model for a summary of the older turns (a request of its
  own, without tools' effects); ``trim`` drops the oldest whole turns; ``reset``
  (on demand only) drops every turn before the open run.

Cuts fall only where a *turn* starts: the first user turn of a run. The events
of a run stay together, so every ``tool_use`` keeps its ``tool_result``, and the
open run is never cut into (its steps and usage are counted from the journal).
The keeper also keeps the projection of the journal between steps (and, through
``EntityState.derived``, between wakes of a warm entity), so a step costs what it
adds, not the length of the conversation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec

from .context_window import ContextPolicy, estimate_tokens, is_prompt_too_long, refused_limit
from .errors import ModelError
from .events import AssistantStep, ConversationCompacted, HistoryEvent, ToolOutcome, UserTurn
from .history import Projection, project
from .models import Model, ModelRequest, Usage
from .streamids import id_gt

SUMMARY_SYSTEM = (
    "You compress conversations. Summarise the conversation so far for the assistant who "
    "will continue it: the user's goals and requests, facts and decisions established, "
    "results of tool calls that still matter, and open questions. Be concise and complete; "
    "write plain text; do not call tools."
)
SUMMARY_REQUEST = (
    "Summarise the conversation above, as instructed, so that it can continue from your "
    "summary alone."
)

Mode = Literal["compact", "trim", "reset"]


def turn_starts(history: list[HistoryEvent]) -> list[int]:
    """Indices of the events that start a turn: the first user turn of each run."""
    starts: list[int] = []
    seen: str | None = None
    for i, event in enumerate(history):
        if isinstance(event, UserTurn) and event.run_id != seen:
            starts.append(i)
        run_id = getattr(event, "run_id", None)
        if run_id is not None:
            seen = run_id
    return starts


def cuts(history: list[HistoryEvent], open_run: str | None, keep_turns: int) -> list[int]:
    """Where the journal may be cut, in order: turn starts after the first, not inside
    the open run, that keep the last ``keep_turns`` turns whole (if none does, every
    turn start: the conversation has to fit)."""
    starts = turn_starts(history)
    points = [i for i in starts if i > 0]
    if open_run is not None:
        first = next((i for i, e in enumerate(history) if _run_of(e) == open_run), len(history))
        points = [i for i in points if i <= first]
    else:
        points.append(len(history))  # no open run: everything may go
    kept = [c for c in points if sum(1 for t in starts if t >= c) >= keep_turns]
    return kept or points


def _run_of(event: HistoryEvent) -> str | None:
    return getattr(event, "run_id", None) if not isinstance(event, ConversationCompacted) else None


def taken_upto(events: list[HistoryEvent]) -> str:
    """The last input id the user turns of ``events`` took (an earlier compaction's too)."""
    last = ""
    for event in events:
        ids = [event.taken_upto] if isinstance(event, ConversationCompacted) else []
        if isinstance(event, UserTurn):
            ids = event.sources
        for entry_id in ids:
            if entry_id and (not last or id_gt(entry_id, last)):
                last = entry_id
    return last


def turns_in(events: list[HistoryEvent]) -> int:
    """User turns in ``events``, counting those an earlier compaction replaced."""
    count = len(turn_starts(events))
    if events and isinstance(events[0], ConversationCompacted):
        count += events[0].turns
    return count


def reset_event(
    history: list[HistoryEvent], open_run: str | None, reason: str = "requested"
) -> ConversationCompacted | None:
    """The event that drops every turn before the open run (all if none is open), or
    None if there is none to drop."""
    points = cuts(history, open_run, 0)
    replaced = history[: points[-1] if points else 0]
    if all(isinstance(e, ConversationCompacted) and e.mode == "reset" for e in replaced):
        return None  # nothing but an earlier reset
    return ConversationCompacted(
        mode="reset",
        replaced=len(replaced),
        turns=turns_in(replaced),
        reason=reason,
        run_id=open_run,
        taken_upto=taken_upto(replaced),
    )


class ContextKeeper:
    """The context management of one agent (one wake): the projection, the size
    estimate, and the compaction events it asks the agent to journal."""

    def __init__(
        self,
        policy: ContextPolicy,
        model: Model,
        *,
        system_prompt: str,
        max_output_tokens: int,
        cache: dict[str, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.model = model
        self.system_prompt = system_prompt
        self.max_output_tokens = max_output_tokens
        self._cache = cache if cache is not None else {}
        self.learned: int | None = None  # the limit a "prompt is too long" answer named
        # What every request of the agent carries, its summaries too (extra_headers and
        # betas: a beta such as a longer context window must reach the summary as well).
        self.headers: dict[str, Any] = {}

    # -- the projection -------------------------------------------------------------

    def messages(self, history: list[HistoryEvent]) -> list[dict[str, Any]]:
        """The projection of ``history``, caught up from where it was last time."""
        projection = self._cache.get("projection")
        if not isinstance(projection, Projection) or not projection.follows(history):
            projection = self._cache["projection"] = Projection()
        projection.catch_up(history)
        return projection.messages()

    # -- the size -------------------------------------------------------------------

    @property
    def limit(self) -> int | None:
        """The policy's limit, or the API's if it refused a request as too long."""
        limits = [x for x in (self.policy.limit(self.max_output_tokens), self.learned) if x]
        return min(limits) if limits else None

    def learn(self, refusal: str) -> None:
        """Take in the limit a "prompt is too long" answer names (what it allows for
        input, less the output reserved), for the rest of this wake."""
        allowed = refused_limit(refusal)
        if allowed is not None:
            self.learned = max(1, int(allowed * 0.9))

    def estimate(self, history: list[HistoryEvent], tools: list[dict[str, Any]]) -> int:
        """The request's size in tokens: the last step's usage (exact up to that step)
        plus an estimate of what was journaled after it; the whole estimated when no
        step since the last compaction reported usage."""
        for i in range(len(history) - 1, -1, -1):
            event = history[i]
            if isinstance(event, ConversationCompacted):
                break
            if isinstance(event, AssistantStep) and event.usage:
                used = Usage(**event.usage)
                # The step's input (with the cache) and output are the conversation so far.
                known = used.total_tokens
                if known:
                    return known + sum(_event_tokens(e) for e in history[i + 1 :])
        return (
            estimate_tokens(self.system_prompt)
            + estimate_tokens(tools)
            + estimate_tokens(self.messages(history))
        )

    async def over_limit(
        self, history: list[HistoryEvent], request: Callable[[], ModelRequest]
    ) -> int | None:
        """The request's size if it passes the limit (None if it fits or has no limit).

        Near the limit, a model that counts tokens (``count_tokens``) has the last word."""
        limit = self.limit
        if limit is None:
            return None
        size = self.estimate(history, request().tools)
        if size > 0.85 * limit:
            counter = getattr(self.model, "count_tokens", None)
            if counter is not None:
                with contextlib.suppress(ModelError):  # if it fails, the estimate stands
                    size = await counter(request())
        return size if size > limit else None

    # -- shortening -----------------------------------------------------------------

    async def shorten(
        self,
        history: list[HistoryEvent],
        *,
        open_run: str | None,
        tools: list[dict[str, Any]],
        reason: str,
        mode: Mode | None = None,
        size: int | None = None,
        race: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None,
    ) -> ConversationCompacted | None:
        """The event that shortens ``history`` by ``mode`` (the policy's strategy by
        default), or None if nothing can be cut (only the open run is left)."""
        mode = mode or ("trim" if self.policy.strategy == "trim" else "compact")
        if mode == "reset":
            return reset_event(history, open_run, reason)
        keep = self.policy.keep_turns
        points = cuts(history, open_run, keep)
        if not points:
            return None
        before = size if size is not None else self.estimate(history, tools)
        cut = self._trim_point(history, points, before) if mode == "trim" else points[-1]
        replaced = history[:cut]
        event = ConversationCompacted(
            mode=mode,
            replaced=cut,
            turns=turns_in(replaced),
            reason=reason,
            tokens_before=before,
            run_id=open_run,
            taken_upto=taken_upto(replaced),
        )
        if mode == "compact":
            summary, usage = await self._summarise(replaced, tools, race)
            event.summary = summary
            event.usage = msgspec.structs.asdict(usage)
        return event

    def _trim_point(self, history: list[HistoryEvent], points: list[int], before: int) -> int:
        """The first cut that brings the conversation under the limit (the last one
        if none does): the oldest whole turns go, and no more."""
        limit = self.limit
        if limit is None:
            return points[-1]
        for cut in points:
            dropped = sum(_event_tokens(e) for e in history[:cut])
            if before - dropped <= limit * 0.75:  # leave room to grow before the next trim
                return cut
        return points[-1]

    async def _summarise(
        self,
        replaced: list[HistoryEvent],
        tools: list[dict[str, Any]],
        race: Callable[[Awaitable[Any]], Awaitable[Any]] | None,
    ) -> tuple[str, Usage]:
        """The model's summary of ``replaced``. What is too long to summarise in one
        request loses its oldest turns first (an earlier summary is always kept)."""
        events = list(replaced)
        while True:
            events = self._fitting(events, tools)
            try:
                response = await self._ask_summary(events, tools, race)
            except ModelError as exc:
                shorter = _without_oldest_turns(events)
                if not is_prompt_too_long(exc.status_code, str(exc)) or shorter is None:
                    raise
                self.learn(str(exc))
                events = shorter
                continue
            text = "".join(b.get("text", "") for b in response.content if b.get("type") == "text")
            return text.strip() or "(the earlier conversation had nothing to keep)", response.usage

    def _fitting(
        self, events: list[HistoryEvent], tools: list[dict[str, Any]]
    ) -> list[HistoryEvent]:
        """``events`` without as many of their oldest turns as a summary request needs
        to fit the limit."""
        limit = self.limit
        while limit is not None:
            size = estimate_tokens(project(events)) + estimate_tokens(tools)
            shorter = _without_oldest_turns(events, 1)
            if size <= limit or shorter is None:
                break
            events = shorter
        return events

    async def _ask_summary(
        self,
        events: list[HistoryEvent],
        tools: list[dict[str, Any]],
        race: Callable[[Awaitable[Any]], Awaitable[Any]] | None,
    ) -> Any:
        messages = project(events)
        ask = {"type": "text", "text": SUMMARY_REQUEST}
        if messages and messages[-1]["role"] == "user":
            messages[-1] = {"role": "user", "content": [*messages[-1]["content"], ask]}
        else:
            messages.append({"role": "user", "content": [ask]})
        request = ModelRequest(
            model=self.model.name,
            system=SUMMARY_SYSTEM,
            messages=messages,
            tools=tools,  # the API wants the tools declared when tool_use blocks are sent
            max_tokens=min(self.max_output_tokens, 4096),
            tool_choice={"type": "none"} if tools else None,  # a summary, never a call
            **self.headers,
        )
        work = self.model.complete(request)
        return await (race(work) if race is not None else work)


def _without_oldest_turns(
    events: list[HistoryEvent], turns: int | None = None
) -> list[HistoryEvent] | None:
    """``events`` less their oldest ``turns`` turns (half of them by default), an
    earlier summary kept; None if no turn can go."""
    head = events[:1] if events and isinstance(events[0], ConversationCompacted) else []
    inner = [i for i in turn_starts(events) if i > len(head)]
    if not inner:
        return None
    drop = turns if turns is not None else max(1, (len(inner) + 1) // 2)
    return head + events[inner[min(drop, len(inner)) - 1] :]


def _event_tokens(event: HistoryEvent) -> int:
    """The estimated size of one journal event in a request."""
    if isinstance(event, UserTurn | AssistantStep | ToolOutcome):
        return estimate_tokens(event.content)
    if isinstance(event, ConversationCompacted):
        return estimate_tokens(event.summary or "")
    return 0
