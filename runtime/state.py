"""The state of one entity: its collections' rows, its system state, its snapshot.

:class:`EntityState` holds every row as its msgpack encoding, keyed by primary
key, beside :class:`SystemState` (the runtime's own: the open run, children,
pending tool actions, the agent journal). Folding ``state`` events in log order,
from a snapshot or from the start, rebuilds the same state on any worker; a
snapshot keeps the rows and the system state, and the journal in chunks written
once (:class:`SnapshotWrite`). A handler reads and writes the rows through
``ctx.db`` (``database.py``).

``SystemState.actions`` holds *pending tool actions*: tool calls that wait for a
client's output or a person's approval (``action_requested`` events; answered
through ``rt.approve`` and the rest, see ``actions.py``), not to be confused with
``ctx.db.actions``, the writer of collections (``database.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import ConversationChunkError, SnapshotError
from .events import (
    ActionRequested,
    ActionSettled,
    AssistantStep,
    ChildRunFinished,
    ConversationCompacted,
    HistoryEvent,
    Message,
    MessageHeld,
    ModelRetryWait,
    Op,
    Outbox,
    RunFailedNote,
    RunFinished,
    RunStarted,
    StateChanged,
    Subscribed,
    Subscription,
    TimerFired,
    ToolIntent,
    ToolOutcome,
    UserTurn,
)
from .schema import Collection
from .streamids import ZERO, id_gt

_encoder = msgspec.msgpack.Encoder()
_any_decoder = msgspec.msgpack.Decoder()


_row_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def row_decoder(row: type[Any] | None) -> msgspec.msgpack.Decoder[Any]:
    """One decoder per row type, shared by every wake (building one costs ~20 us)."""
    if row is None:
        return _any_decoder
    decoder = _row_decoders.get(row)
    if decoder is None:
        decoder = _row_decoders[row] = msgspec.msgpack.Decoder(row)
    return decoder


class ChildInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a parent knows of a child it spawned (``ctx.children``)."""

    url: str
    type: str
    args: Any = None
    on_parent_close: str = "cancel"
    wake: Subscription | None = None
    tags: dict[str, str] | None = None
    pending: bool = False  # a run is expected: it was given a message since its last run ended
    status: str = "spawned"  # then the status of its last finished run
    run_id: str | None = None
    response: str | None = None
    error: str | None = None

    @property
    def awaited(self) -> bool:
        """The parent waits for this child's run to finish (it will be woken)."""
        return self.pending and self.wake is not None and self.wake.kind == "run_finished"


class SystemState(msgspec.Struct, kw_only=True):
    """The runtime's own state of an entity, folded from the log like the collections.

    Every fold rule sets a value (never counts), so re-applying a suffix of the
    log leaves the state unchanged, as for collection ops.
    """

    subs: dict[str, Subscription] = {}
    children: dict[str, ChildInfo] = {}
    run: str | None = None  # the open run
    run_started_ms: int = 0  # when the open run started
    run_identity: dict[str, str] | None = None  # whom the open run belongs to
    # Messages of other identities waiting for the open run to finish, by input id.
    held: dict[str, Message] = {}
    last_run: RunFinished | None = None  # the end of the last finished run
    history: list[HistoryEvent] = []  # the agent conversation, in journal order
    actions: dict[str, ActionRequested] = {}  # pending tool actions, by tool call id
    settled: dict[str, ActionSettled] = {}  # answers not yet taken by the run
    answered: dict[str, ActionRequested] = {}  # the requests those answers settled
    conversation_upto: str = ""  # the last conversation_requested input answered
    # Compactions folded so far: the generation of ``history``'s chunk sequence in the
    # snapshot's conversation store (a compaction starts a new one; see Snapshot).
    conv_gen: int = 0

    def apply(self, event: object) -> None:
        cls = type(event)
        rule = _RULES.get(cls)
        if rule is None:
            rule = _RULES[cls] = _rule_of(cls)
        rule(self, event)

    # The fold rules, one per kind of event (``_RULE_ORDER`` says which applies).

    def _subscribed(self, event: Subscribed) -> None:
        self.subs[event.subscriber] = event.spec

    def _effects(self, event: Outbox | TimerFired) -> None:
        for effect in event.effects:
            if effect.kind == "spawn" and effect.target not in self.children:
                self.children[effect.target] = ChildInfo(
                    url=effect.target,
                    type=effect.target.split("/")[1],
                    args=effect.args,
                    on_parent_close=effect.on_parent_close,
                    wake=effect.subscribe,
                    tags=effect.tags,
                    pending=effect.has_payload,
                )
            elif effect.kind == "send" and effect.target in self.children:
                self.children[effect.target].pending = True

    def _child_run_finished(self, event: ChildRunFinished) -> None:
        child = self.children.get(event.child)
        if child is not None:
            child.pending = False
            child.status = event.status
            child.run_id = event.run_id
            child.response = event.response
            child.error = event.error

    def _history(self, event: HistoryEvent) -> None:
        self.history.append(event)
        if isinstance(event, ToolOutcome):
            self.settled.pop(event.tool_call_id, None)
            self.answered.pop(event.tool_call_id, None)

    def _compacted(self, event: ConversationCompacted) -> None:
        # An output, folded exactly once (EntityState.fold), so a count is safe here.
        self.history = [event, *self.history[event.replaced :]]
        self.conv_gen += 1
        if event.request:
            self.conversation_upto = event.request

    def _action_requested(self, event: ActionRequested) -> None:
        self.actions[event.tool_call_id] = event
        self.settled.pop(event.tool_call_id, None)  # requested again: its answer refused
        self.answered.pop(event.tool_call_id, None)

    def _action_settled(self, event: ActionSettled) -> None:
        request = self.actions.pop(event.tool_call_id, None)
        if request is not None:
            self.settled[event.tool_call_id] = event
            self.answered[event.tool_call_id] = request

    def _run_started(self, event: RunStarted) -> None:
        self.run = event.run_id
        self.run_started_ms = event.at_ms
        self.run_identity = event.identity

    def _message_held(self, event: MessageHeld) -> None:
        self.held[event.input_id] = event.message

    def _run_finished(self, event: RunFinished) -> None:
        if self.run != event.run_id:
            return
        self.run = None
        self.run_identity = None
        self.held = {}  # released by the same commit (Activation.finish_run)
        self.last_run = msgspec.structs.replace(event, response=None)  # small snapshots
        # Calls of the run that still wait for an answer end with it.
        for call_id in [k for k, a in self.actions.items() if a.run_id == event.run_id]:
            del self.actions[call_id]
        for call_id in [k for k, a in self.answered.items() if a.run_id == event.run_id]:
            del self.answered[call_id]
            self.settled.pop(call_id, None)

    def _nothing(self, event: object) -> None:
        return None

    def awaited_children(self) -> int:
        return sum(1 for child in self.children.values() if child.awaited)


_Rule = Callable[[SystemState, Any], None]

# Which rule folds which kind of event: the first entry the event is an instance of
# (so a subclass follows its base). Looked up once per class, then kept in ``_RULES``:
# a fold does one dict lookup per event instead of a chain of isinstance checks.
_RULE_ORDER: list[tuple[tuple[type[Any], ...], _Rule]] = [
    ((Subscribed,), SystemState._subscribed),
    ((Outbox, TimerFired), SystemState._effects),
    ((ChildRunFinished,), SystemState._child_run_finished),
    (
        (UserTurn, AssistantStep, ToolIntent, ToolOutcome, RunFailedNote, ModelRetryWait),
        SystemState._history,
    ),
    ((ConversationCompacted,), SystemState._compacted),
    ((ActionRequested,), SystemState._action_requested),
    ((ActionSettled,), SystemState._action_settled),
    ((RunStarted,), SystemState._run_started),
    ((MessageHeld,), SystemState._message_held),
    ((RunFinished,), SystemState._run_finished),
]
_RULES: dict[type[Any], _Rule] = {}


def _rule_of(cls: type[Any]) -> _Rule:
    for kinds, rule in _RULE_ORDER:
        if issubclass(cls, kinds):
            return rule
    return SystemState._nothing


CHUNK_EVENTS = 64
"""Events of the conversation per sealed chunk (see :class:`Snapshot`)."""


class ConversationRef(msgspec.Struct, kw_only=True, frozen=True):
    """The sealed part of the conversation: chunks ``<gen>:0`` .. ``<gen>:<chunks-1>``
    of the entity's conversation hash (``keys.conv``) hold, in order, the first
    ``events`` events of ``SystemState.history``."""

    gen: int = 0
    chunks: int = 0
    events: int = 0


_NO_CHUNKS = ConversationRef()  # frozen: one instance serves every new state


def chunk_field(gen: int, index: int) -> str:
    """The conversation hash's field of chunk ``index`` of generation ``gen``."""
    return f"{gen}:{index}"


class Snapshot(msgspec.Struct, kw_only=True):
    """Materialised state; the log position it covers is ``snap_upto`` in the metadata.

    ``v=1``: the whole conversation is inline in ``system.history`` (every snapshot
    of an entity without a sealed chunk, and every snapshot written before chunks).
    ``v=2``: ``conv`` names the sealed chunks, and ``system.history`` holds only the
    open tail after them; the chunks were written by the commit that wrote the
    snapshot that first referenced them (or an earlier one), in the same script."""

    v: int = 1
    rows: dict[str, dict[Any, msgspec.Raw]]
    system: SystemState = msgspec.field(default_factory=SystemState)
    conv: ConversationRef | None = None


@dataclass(frozen=True, slots=True)
class SnapshotWrite:
    """What one snapshot writes: the snapshot itself, the conversation chunks it seals
    (``field -> bytes``, new ones only) and the fields of chunks no snapshot will
    reference once it is written (an older generation's, after a compaction)."""

    data: bytes
    chunks: list[tuple[str, bytes]]
    drop: list[str]
    ref: ConversationRef  # the sealed part once written
    stored_bytes: int  # bytes of every chunk it references

    @property
    def nbytes(self) -> int:
        """The state's size as stored: the snapshot plus the chunks it references."""
        return len(self.data) + self.stored_bytes

    @property
    def written(self) -> int:
        """Bytes this write sends: the snapshot and the new chunks."""
        return len(self.data) + sum(len(data) for _, data in self.chunks)


_chunk_decoder = msgspec.msgpack.Decoder(list[HistoryEvent])


class EntityState:
    """Rows of every collection of one entity, as encoded bytes, plus the system state.

    ``applied`` is the id of the last output event folded in; ``derived`` holds what
    is computed from the state and worth keeping while it stays warm. Outputs are applied
    in memory before their commit, so a later read of the log skips the outputs
    at or before ``applied``; everything else read is new and is folded.
    """

    __slots__ = ("applied", "derived", "nbytes", "rows", "stored", "stored_bytes", "system")

    def __init__(self, collections: dict[str, Collection[Any]] | None = None) -> None:
        self.rows: dict[str, dict[Any, bytes]] = {name: {} for name in (collections or {})}
        self.system = SystemState()
        self.applied = ZERO
        # Values derived from the state and kept with it between wakes of a warm
        # entity (the agent's projection of the conversation); never persisted.
        self.derived: dict[str, Any] = {}
        # About how many bytes it holds: its snapshot's plus those of the events folded
        # since (an over-estimate once a compaction drops some); bounds the warm cache.
        self.nbytes = 0
        # The conversation chunks in Redis as the last snapshot written or read left
        # them (what the next snapshot need not write again), and their bytes.
        self.stored = _NO_CHUNKS
        self.stored_bytes = 0

    def fold(self, entry_id: str, event: object, size: int = 0) -> None:
        """Apply one log entry read after the last read position, exactly once
        (``size``: its encoded bytes, counted in ``nbytes``)."""
        if getattr(event, "is_output", False):
            if not id_gt(entry_id, self.applied):
                return  # already applied when it was written (and counted then)
            self.applied = entry_id
        self.nbytes += size
        self.apply_event(event)

    def apply(self, ops: list[Op]) -> None:
        for op in ops:
            table = self.rows.setdefault(op.collection, {})
            if op.op == "delete":
                table.pop(op.key, None)
            elif op.op == "insert":
                # An insert happened while the key was absent, so the row went to the
                # end. Moving it there again keeps re-applying a suffix of the log
                # idempotent for row order too (the key may still be present then).
                table.pop(op.key, None)
                table[op.key] = bytes(op.row)
            else:
                table[op.key] = bytes(op.row)

    def apply_event(self, event: object) -> None:
        if isinstance(event, StateChanged):
            self.apply(event.ops)
        else:
            self.system.apply(event)

    def snapshot(self) -> bytes:
        """A self-contained snapshot: the whole conversation inline (``v=1``), as before
        chunks; the worker writes :meth:`snapshot_write` instead."""
        return _encoder.encode(Snapshot(rows=self._raw_rows(), system=self.system))

    def _raw_rows(self) -> dict[str, dict[Any, msgspec.Raw]]:
        return {
            name: {key: msgspec.Raw(data) for key, data in table.items()}
            for name, table in self.rows.items()
        }

    def snapshot_write(self) -> SnapshotWrite:
        """The snapshot to write now, and the conversation chunks to write and drop with it.

        The conversation is stored in chunks of :data:`CHUNK_EVENTS` events, each
        written once, by the snapshot that seals it; the snapshot holds only their
        reference and the open tail, so its size does not grow with the conversation.
        A compaction (a new ``conv_gen``) starts a new sequence: the old chunks are
        dropped by the same write."""
        history, gen, stored = self.system.history, self.system.conv_gen, self.stored
        drop: list[str] = []
        stored_bytes = self.stored_bytes
        if stored.gen != gen or stored.events > len(history):
            # A new sequence (the second case cannot happen: the history only shrinks
            # by a compaction; rewriting is the safe answer should it ever).
            drop = [chunk_field(stored.gen, k) for k in range(stored.chunks)]
            stored, stored_bytes = ConversationRef(gen=gen), 0
        chunks: list[tuple[str, bytes]] = []
        events, index = stored.events, stored.chunks
        while len(history) - events >= CHUNK_EVENTS:
            data = _encoder.encode(history[events : events + CHUNK_EVENTS])
            chunks.append((chunk_field(gen, index), data))
            stored_bytes += len(data)
            events += CHUNK_EVENTS
            index += 1
        ref = ConversationRef(gen=gen, chunks=index, events=events)
        rows = self._raw_rows()
        if index:
            system = msgspec.structs.replace(self.system, history=history[events:])
            snap = Snapshot(v=2, rows=rows, system=system, conv=ref)
        else:
            snap = Snapshot(rows=rows, system=self.system)
        return SnapshotWrite(_encoder.encode(snap), chunks, drop, ref, stored_bytes)

    def written(self, write: SnapshotWrite) -> None:
        """``write`` was committed: its chunks are what Redis holds now."""
        self.stored, self.stored_bytes = write.ref, write.stored_bytes

    @classmethod
    def from_snapshot(
        cls,
        data: bytes,
        collections: dict[str, Collection[Any]],
        applied: str = ZERO,
        chunks: Mapping[bytes, bytes] | None = None,
    ) -> EntityState:
        """The state of a snapshot; ``chunks`` are the fields of the entity's
        conversation hash (read with the snapshot, in one script)."""
        try:
            snap = msgspec.msgpack.decode(data, type=Snapshot)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
            raise SnapshotError(f"its snapshot cannot be decoded: {exc}") from exc
        state = cls(collections)
        for name, table in snap.rows.items():
            state.rows[name] = {key: bytes(raw) for key, raw in table.items()}
        state.system = snap.system
        state.applied = applied
        state.nbytes = len(data)
        if snap.conv is not None and snap.conv.chunks:
            sealed, stored_bytes = _read_chunks(snap.conv, chunks or {})
            snap.system.history = sealed + snap.system.history
            state.stored, state.stored_bytes = snap.conv, stored_bytes
            state.nbytes += stored_bytes
        return state

    def to_builtins(self) -> dict[str, list[Any]]:
        return {
            name: [_any_decoder.decode(data) for data in table.values()]
            for name, table in self.rows.items()
        }


def _read_chunks(
    ref: ConversationRef, chunks: Mapping[bytes, bytes]
) -> tuple[list[HistoryEvent], int]:
    """The sealed events ``ref`` names, from the conversation hash's ``chunks``, and
    their bytes; a missing or unreadable chunk raises :class:`ConversationChunkError`."""
    events: list[HistoryEvent] = []
    nbytes = 0
    for index in range(ref.chunks):
        name = chunk_field(ref.gen, index)
        data = chunks.get(name.encode())
        if data is None:
            raise ConversationChunkError(
                f"its snapshot references conversation chunk {name}, which is missing"
            )
        try:
            events.extend(_chunk_decoder.decode(data))
        except msgspec.DecodeError as exc:
            raise ConversationChunkError(
                f"its conversation chunk {name} cannot be decoded: {exc}"
            ) from exc
        nbytes += len(data)
    if len(events) != ref.events:
        raise ConversationChunkError(
            f"its conversation chunks hold {len(events)} events, the snapshot says {ref.events}"
        )
    return events, nbytes
