"""One wake of one entity: what the handler did, turned into commits.

An :class:`Activation` collects everything a handler does during a wake:

* collection writes (through ``ctx.db.actions``, the collections' writer),
* runs (``record_run``, ``reply``, ``fail_run``),
* effects leaving the entity: sends, spawns, observations, and the
  notifications the runtime adds for subscribers when a run finishes or
  observed collections change.

At a commit point it turns them into log events and timers for
:meth:`Store.commit`. Effects leave through the entity's own log (an ``outbox``
event) and are delivered after the commit. Each effect's idempotency key is
derived from the wake (its first input id), a scope inside it (the tool call,
or the input the handler is on) and the effect's position in that scope, so a
handler replayed after a crash produces the same keys and nothing is delivered
twice, and a replay that skips an input cannot shift the keys of the next.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from . import tracing
from .database import Database
from .events import (
    RUNTIME_EVENT_MAX_BYTES,
    ActionRequested,
    CancelRequested,
    Changed,
    ChildRunFinished,
    Effect,
    Event,
    LogRecord,
    Outbox,
    RunFinished,
    RunStarted,
    StateChanged,
    Subscription,
    TimerFired,
    encode_event,
)
from .scope import ALL, CURRENT_TOOL_CALL, take
from .state import EntityState
from .streamids import id_gt

# Flags for Store.commit: how the commit script treats each appended event.
PLAIN, INPUT, OUTBOX = "e", "i", "o"


@dataclass(frozen=True, slots=True)
class Timer:
    """A delayed effect: ``data`` (an encoded ``timer_fired`` event) is appended at ``due_ms``."""

    member: str
    due_ms: int
    data: bytes


@dataclass
class CommitBatch:
    events: list[tuple[str, bytes]] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)
    outbox: Outbox | None = None  # the immediate effects, delivered after the commit
    # Tool calls that now wait for a pending tool action (a client's output, an approval).
    actions: list[str] = field(default_factory=list)
    # Pending actions whose run finished: (tool call id, how the run ended).
    closed_actions: list[tuple[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.events or self.timers)


class Activation:
    """The buffer of one wake: what the handler did since the last commit point."""

    def __init__(
        self,
        *,
        url: str,
        created: str,
        state: EntityState,
        db: Database,
        inputs: list[LogRecord],
        max_event_bytes: int,
        identity: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        # Whom this wake acts for (``wakeful.run_owner.split_inputs``): a run it opens
        # belongs to it, and the messages and children it makes carry it.
        self.identity = identity
        self.created = created
        self.state = state
        self.db = db
        self.inputs = inputs
        self.wake_id = inputs[0].id if inputs else "0-0"
        self.limit = max_event_bytes
        self._counters: dict[str, int] = {}
        self._input: str | None = None  # the input the handler is on (see ``handling``)
        self.asked: str | None = None  # the last input it was on
        self.derived: set[str] = set()  # ids from derive_id: no other entity can have made them
        self._commits = 0
        self._attempt_id: str | None = None  # see ``_attempt``
        # Buffered until the next commit point, with the tool call that made them.
        self._events: list[tuple[str | None, Event]] = []
        self._effects: list[tuple[str | None, Effect]] = []
        self._closed: list[tuple[str | None, tuple[str, str]]] = []

    @property
    def _attempt(self) -> str:
        """This attempt at the wake, for change notices: random, drawn when first
        needed (most wakes make no change notice, and the draw is a system call)."""
        if self._attempt_id is None:
            self._attempt_id = secrets.token_hex(6)
        return self._attempt_id

    # -- keys and ids ------------------------------------------------------------

    def handling(self, input_id: str) -> None:
        """The handler is now on input ``input_id`` (``ctx.wake.attempted(record)``
        says so): the effects it makes until the next input are counted for it."""
        self._input = input_id
        if self.asked is None or id_gt(input_id, self.asked):
            self.asked = input_id

    def _scope(self) -> tuple[str, int]:
        """The current key scope and the next number in it.

        Keys count within a scope, never across the whole wake, so that a retried
        attempt that skips work an earlier attempt flushed cannot shift the keys of
        later effects onto the keys of what the earlier attempt sent.

        Inside a tool call the scope is the wake plus the ``tool_call_id``: a
        journaled run replays only the calls that did not finish. (A call id alone
        is not enough: a scripted model may reuse ids in later runs.) Outside
        tool calls, once the handler asked ``ctx.wake.attempted(record)``, the
        scope is the wake plus that input: a retry that skips an input an earlier
        attempt had counts the next input's effects from one, as every attempt
        does, and a retry that redoes the input gets the same keys again.
        Otherwise the scope is the wake (its first input id).
        """
        call = CURRENT_TOOL_CALL.get()
        if call is not None:
            scope = f"{self.wake_id}|{call}"
        elif self._input is not None:
            scope = f"{self.wake_id}|@{self._input}"
        else:
            scope = self.wake_id
        n = self._counters.get(scope, 0) + 1
        self._counters[scope] = n
        return scope, n

    def next_key(self) -> str:
        """Idempotency key of the next effect: stable across replays of this wake."""
        scope, n = self._scope()
        return f"{self.url}|{scope}|{n}"

    def derive_id(self, prefix: str) -> str:
        """A child id that is the same when the wake is replayed (unlike a timestamp).

        It is ``<prefix>-<16 hex digits>``, a digest of this entity, the wake, the
        tool call (if any) and the call's position, so two parents never derive
        the same id."""
        scope, n = self._scope()
        digest = hashlib.blake2s(f"{self.url}|{scope}|{n}".encode(), digest_size=8).hexdigest()
        derived = f"{prefix}-{digest}"
        self.derived.add(derived)
        return derived

    # -- runs --------------------------------------------------------------------

    @property
    def current_run(self) -> str | None:
        return self.state.system.run

    def record_run(self) -> str:
        """Open a run for this wake unless one is open; return its id."""
        if self.state.system.run is None:
            self.record(
                RunStarted(
                    run_id=f"run-{self.wake_id}",
                    at_ms=int(time.time() * 1000),
                    identity=self.identity,
                )
            )
        return self.state.system.run  # type: ignore[return-value]

    def finish_run(
        self,
        status: str,
        *,
        response: str | None = None,
        error: str | None = None,
        usage: dict[str, int] | None = None,
        steps: int = 0,
        tool_calls: int = 0,
        stop_reason: str | None = None,
        stop_sequence: str | None = None,
        stop_details: dict[str, Any] | None = None,
        output: Any = None,
        output_type: str | None = None,
    ) -> str:
        run_id = self.record_run()
        # A run that ends (cancelled, failed) while calls wait for answers settles them:
        # the fold drops them with the run, the commit marks them closed in the hash.
        call = CURRENT_TOOL_CALL.get()
        for action in self.state.system.actions.values():
            if action.run_id == run_id:
                self._closed.append((call, (action.tool_call_id, status)))
        # Messages of other identities waited for this run: each goes to the entity
        # again, after the run, to start a run of its own (the fold forgets them with
        # the RunFinished below, in the same commit).
        for message in self.state.system.held.values():
            self.add_effect(
                Effect(kind="notify", target=self.url, key=self.next_key(), notice=message)
            )
        self.record(
            RunFinished(
                run_id=run_id,
                status=status,  # type: ignore[arg-type]
                response=response,
                error=error,
                usage=usage,
                steps=steps,
                tool_calls=tool_calls,
                at_ms=int(time.time() * 1000),
                stop_reason=stop_reason,
                stop_sequence=stop_sequence,
                stop_details=stop_details,
                output=output,
                output_type=output_type,
            )
        )
        return run_id

    def record(self, event: Event) -> None:
        """Apply an output event to the state now; it is committed at the next commit point."""
        self.state.system.apply(event)
        self._events.append((CURRENT_TOOL_CALL.get(), event))

    # -- effects -----------------------------------------------------------------

    def add_effect(self, effect: Effect) -> Effect:
        effect.trace = effect.trace or tracing.carrier()  # the span it is made in
        # Encode now so an oversized or unencodable payload fails in the handler, at the call.
        encode_event(
            Outbox(effects=[effect]), limit=self.limit, what=f"{effect.kind} to {effect.target}"
        )
        self._effects.append((CURRENT_TOOL_CALL.get(), effect))
        if not effect.due_ms:
            self.state.system.apply(Outbox(effects=[effect]))
        return effect

    def cancel_effects(self, reason: str) -> None:
        """Runtime reaction to a cancel or delete: finish the open run, cancel children."""
        if self.state.system.run is not None:
            self.finish_run("cancelled", error=reason)
        for child in self.state.system.children.values():
            if child.on_parent_close == "cancel":
                self.add_effect(
                    Effect(
                        kind="cancel",
                        target=child.url,
                        key=self.next_key(),
                        notice=CancelRequested(reason=f"parent {self.url}: {reason}", by=self.url),
                    )
                )

    # -- commits -----------------------------------------------------------------

    def take_commit(self, scope: str | None = ALL) -> CommitBatch:
        """What is buffered for a commit point: everything (``ALL``, the end of the
        wake), or the wake's own items plus those of tool call ``scope``."""
        self._commits += 1
        batch = CommitBatch()
        ops = self.db.actions.take_pending(scope)
        if ops:
            batch.events.append(
                (PLAIN, encode_event(StateChanged(ops=ops), limit=RUNTIME_EVENT_MAX_BYTES))
            )
        events = take(self._events, scope)
        finished = [e for e in events if isinstance(e, RunFinished)]
        for event in events:
            batch.events.append((PLAIN, encode_event(event, limit=RUNTIME_EVENT_MAX_BYTES)))
            if isinstance(event, ActionRequested):
                batch.actions.append(event.tool_call_id)
        batch.closed_actions = take(self._closed, scope)
        effects = take(self._effects, scope)
        if self.state.system.subs:
            for notice in self._notifications(finished, {op.collection for op in ops}):
                notice.trace = tracing.carrier()  # the span of the commit that made it
                effects.append(notice)
        immediate = [e for e in effects if not e.due_ms]
        if immediate:
            batch.outbox = Outbox(effects=immediate)
            batch.events.append((OUTBOX, encode_event(batch.outbox, limit=RUNTIME_EVENT_MAX_BYTES)))
        for effect in effects:
            if effect.due_ms:
                batch.timers.append(self._timer(effect))
        return batch

    def _notifications(self, finished: list[RunFinished], changed: set[str]) -> list[Effect]:
        out: list[Effect] = []
        for subscriber, spec in sorted(self.state.system.subs.items()):
            if spec.kind == "run_finished":
                for run in finished:
                    out.append(self._run_notice(subscriber, spec, run))
            elif spec.kind == "change" and changed:
                names = sorted(
                    changed if spec.collections is None else changed & set(spec.collections)
                )
                if names:
                    out.append(self._change_notice(subscriber, spec, names))
        return out

    def _run_notice(self, subscriber: str, spec: Subscription, run: RunFinished) -> Effect:
        notice = ChildRunFinished(
            child=self.url,
            run_id=run.run_id,
            status=run.status,
            response=run.response if spec.include_response else None,
            error=run.error,
            stop_reason=run.stop_reason,
            output=run.output if spec.include_response else None,
            output_type=run.output_type,
        )
        return Effect(
            kind="notify",
            target=subscriber,
            key=f"{self.url}|run|{run.run_id}|{subscriber}",
            notice=notice,
        )

    def _change_notice(self, subscriber: str, spec: Subscription, names: list[str]) -> Effect:
        # Made at the commit (not by the handler), and delivered from the journaled
        # outbox after a crash: the key need not be the same in another attempt, and
        # must not be (a retry's commits are changes of their own).
        key = f"{self.url}|chg|{subscriber}|{self.wake_id}|{self._attempt}|{self._commits}"
        due = int(time.time() * 1000) + spec.debounce_ms if spec.debounce_ms else 0
        return Effect(
            kind="notify",
            target=subscriber,
            key=key,
            notice=Changed(entity=self.url, collections=names),
            due_ms=due,
        )

    def _timer(self, effect: Effect) -> Timer:
        if effect.kind == "notify" and isinstance(effect.notice, Changed):
            # One pending change notice per observer: later changes of the burst join it.
            member = f"{self.url}|{self.created}|chg|{effect.target}"
        else:
            member = f"{self.url}|{self.created}|{effect.key}"
        fired = Effect(**{**_fields(effect), "due_ms": 0})
        data = encode_event(
            TimerFired(effects=[fired], timer=member), limit=RUNTIME_EVENT_MAX_BYTES
        )
        return Timer(member, effect.due_ms, data)


def _fields(struct: Any) -> dict[str, Any]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}
