"""The kinds of event of an entity log: one msgspec Struct per kind.

Every entry of an entity log is one event: a msgspec Struct from the tagged
union :data:`AnyEvent`, msgpack-encoded under the stream field ``e`` (by
``events.py``, which re-exports every kind: import them from there). The tag
(``t``) names the kind; ``v`` is the schema version of that kind, 1 for every
kind so far. New fields are added with defaults so older entries keep decoding.
There is no upgrade step: a kind whose meaning changed would need a new ``v`` and
a decoder that reads both (none exists yet), so meanings of kinds do not change.

Events are either *inputs* (they wake the entity: ``created``, ``msg``,
``child_run_finished``, ``changed``, ``cancel``, ``delete``, ``delivery_failed``,
``conversation_requested``),
*system* events folded by the runtime but not shown to handlers (``subscribed``),
or *outputs* written by the entity's own fenced commits (``state``, ``outbox``,
``run_started``, ``run_finished``, ``message_held``, ``handler_error``, ``failed``,
``resumed``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec


class Event(msgspec.Struct, tag_field="t", kw_only=True, omit_defaults=True):
    """Base of all log events.

    ``is_input``: wakes the entity. ``is_output``: written only by the entity's
    own commits, and applied to its in-memory state before it is committed (so
    a fold skips outputs it has already applied; see ``EntityState.fold`` in state.py).
    """

    is_input: ClassVar[bool] = False
    is_output: ClassVar[bool] = False
    v: int = 1
    # The W3C trace context (traceparent, tracestate) of the span that wrote the event
    # (tracing.py); absent when tracing is off, and in entries written before it existed.
    trace: dict[str, str] | None = None


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
    client_tools: list[dict[str, Any]] | None = None  # tools the sending client answers itself
    # Content blocks for the model after the payload's text (images, documents, text),
    # checked when sent (content_blocks.py) and journaled as they are.
    content: list[dict[str, Any]] | None = None


# How a run ended. ``truncated``: the model's answer was cut off (``max_tokens``,
# ``model_context_window_exceeded``); ``refused``: the model declined (``refusal``).
RunStatus = Literal["completed", "failed", "cancelled", "truncated", "refused"]


class RunEnd(Event):
    """How a run ended: what its ``run_finished`` records and what a subscriber's
    ``child_run_finished`` repeats (not a kind of its own)."""

    run_id: str
    status: RunStatus
    response: str | None = None
    error: str | None = None
    # An agent run: why the model stopped its last step (``end_turn``, ``max_tokens``,
    # ``refusal``, ...). None for runs without a model.
    stop_reason: str | None = None
    # A structured answer (output_type): JSON builtins, and the name of its type.
    output: Any = None
    output_type: str | None = None


class ChildRunFinished(RunEnd, tag="child_run_finished", kw_only=True):
    """A run of an entity this one subscribed to (``Wake.run_finished``) finished."""

    is_input: ClassVar[bool] = True
    child: str


class Changed(Event, tag="changed"):
    """Collections of an observed entity changed (``Wake.change``), once per burst."""

    is_input: ClassVar[bool] = True
    entity: str
    collections: list[str]


class CancelRequested(Event, tag="cancel"):
    """Stop the current run (it finishes as cancelled) and cancel children per policy."""

    is_input: ClassVar[bool] = True
    reason: str = "cancelled"
    by: str | None = None


class DeleteRequested(Event, tag="delete"):
    """Cancel, apply the parent-close policy to children, then delete every key."""

    is_input: ClassVar[bool] = True
    by: str | None = None


class DeliveryFailed(Event, tag="delivery_failed"):
    """An outgoing effect could not be delivered (for example a spawn with other args)."""

    is_input: ClassVar[bool] = True
    kind: str
    target: str
    error: str


class Subscription(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What wakes a subscriber: a finished run, or a change of collections."""

    kind: Literal["run_finished", "change"]
    include_response: bool = True
    collections: list[str] | None = None
    debounce_ms: int = 0


class Subscribed(Event, tag="subscribed"):
    """``subscriber`` wants to be woken by this entity (system event, not an input)."""

    subscriber: str
    spec: Subscription


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
    is_output: ClassVar[bool] = True
    ops: list[Op]


class HandlerFailed(Event, tag="handler_error"):
    """The handler raised; the inputs stay unprocessed and will be retried."""

    is_output: ClassVar[bool] = True
    error_type: str
    error: str
    traceback: str
    attempt: int
    inputs: list[str]


class EntityFailed(Event, tag="failed"):
    """Retries are exhausted (or an input could not be decoded); the entity is parked."""

    is_output: ClassVar[bool] = True
    error: str
    attempts: int
    inputs: list[str]


class Effect(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One message leaving an entity through its outbox.

    ``key`` is derived from the sender's wake and the effect's position in it,
    so a replayed handler produces the same key and delivery deduplicates.
    """

    kind: Literal["send", "spawn", "subscribe", "notify", "cancel", "expire"]
    target: str
    key: str
    payload: Any = None  # send; spawn: the initial message
    has_payload: bool = False
    args: Any = None  # spawn
    subscribe: Subscription | None = None  # spawn, subscribe
    on_parent_close: Literal["cancel", "keep"] = "cancel"  # spawn
    tags: dict[str, str] | None = None  # spawn
    # notify (a held message released to its own run is a notify with the Message), cancel
    notice: ChildRunFinished | Changed | CancelRequested | Message | ModelRetryDue | None = None
    # send, spawn: the identity of the run that made it (the message carries it, and a
    # spawned child is owned by it)
    identity: dict[str, str] | None = None
    due_ms: int = 0  # a durable timer: deliver at this time (epoch ms)
    trace: dict[str, str] | None = None  # the span that made it (tracing.py)


class Outbox(Event, tag="outbox"):
    """Effects committed by the entity, delivered after the commit (and again after
    a crash, deduplicated by their keys)."""

    is_output: ClassVar[bool] = True
    effects: list[Effect]


class TimerFired(Event, tag="timer_fired"):
    """A durable timer came due: its effects are delivered like an outbox.

    Written by the timer script, not by a commit, so it is not an output."""

    effects: list[Effect]
    timer: str


class RunStarted(Event, tag="run_started"):
    """A run opened. It belongs to ``identity`` (the identity of the messages that
    opened it, or the entity's owner): only its messages join it, and its pending
    actions are answered by it. None: no identity (or a run journaled before runs
    recorded one)."""

    is_output: ClassVar[bool] = True
    run_id: str
    at_ms: int = 0  # when (epoch ms; 0 in entries written before it was recorded)
    identity: dict[str, str] | None = None


class MessageHeld(Event, tag="message_held"):
    """A message of another identity than the open run's: it does not join the run,
    it waits. When the run finishes, the message is sent to the entity again (an
    outbox notice with the same message) and starts a run of its own."""

    is_output: ClassVar[bool] = True
    input_id: str  # the id of the held message in the log
    message: Message


class RunFinished(RunEnd, tag="run_finished"):
    is_output: ClassVar[bool] = True
    usage: dict[str, int] | None = None
    steps: int = 0
    tool_calls: int = 0
    at_ms: int = 0  # when (epoch ms; 0 in entries written before it was recorded)
    # An agent run's stop sequence it matched, and the API's ``stop_details`` (a
    # refusal's ``category`` and ``explanation``), beside its ``stop_reason``.
    stop_sequence: str | None = None
    stop_details: dict[str, Any] | None = None


# --- the agent loop's journal (outputs; they make up the conversation) -------


class UserTurn(Event, tag="user_turn"):
    """Inputs taken into a run, rendered as user content; ``sources`` are their ids."""

    is_output: ClassVar[bool] = True
    run_id: str
    content: list[dict[str, Any]]
    sources: list[str] = []
    identity: dict[str, str] | None = None  # of the last message taken (trusted)
    client_data: Any = None  # of the last message taken (untrusted)
    client_tools: list[dict[str, Any]] | None = None  # offered by that message's client


class AssistantStep(Event, tag="assistant_step"):
    """One model response, journaled before any of its tool calls runs."""

    is_output: ClassVar[bool] = True
    run_id: str
    step: int
    content: list[dict[str, Any]]
    stop_reason: str
    usage: dict[str, int] = {}
    model: str = ""
    stop_sequence: str | None = None  # the custom stop sequence the response matched
    stop_details: dict[str, Any] | None = None  # e.g. a refusal's category and explanation
    # Server-tool usage of the step (``{"web_search_requests": 2}``), kept apart from the
    # token counts so ``usage`` sums as before.
    server_tool_use: dict[str, int] | None = None


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    name: str
    input: Any = None
    # The stable id of the tool the call was made to (``acme.createTask/v1``), beside the
    # name the model used; None for a tool without one and in logs written before it.
    tool_id: str | None = None


class ToolIntent(Event, tag="tool_intent"):
    """Tool calls about to run. A call with an intent and no result is in doubt."""

    is_output: ClassVar[bool] = True
    run_id: str
    calls: list[ToolCall]


class ToolOutcome(Event, tag="tool_result"):
    """The result of one tool call, as the model will see it (``details`` is for clients)."""

    is_output: ClassVar[bool] = True
    run_id: str
    tool_call_id: str
    name: str
    content: list[dict[str, Any]]
    is_error: bool = False
    details: Any = None
    tool_id: str | None = None  # the stable id of the tool (see ToolCall.tool_id)


class ActionRequested(Event, tag="action_requested"):
    """A tool call waits for someone outside: a client-routed tool's output, or an
    approval. The run is suspended until the action is settled."""

    is_output: ClassVar[bool] = True
    run_id: str
    tool_call_id: str
    tool: str  # the registration key (the name the model used)
    kind: Literal["client", "approval"]
    tool_id: str | None = None  # the stable id of the tool (see ToolCall.tool_id)
    input: Any = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    authorized: dict[str, str] | None = None  # the identity that may answer (None: anyone)
    created_ms: int = 0
    expires_ms: int = 0  # 0: never
    # Set when the action is requested again because an answer to it was refused at
    # the run (the tool was disabled by then): why, so clients can tell the person.
    refused: str | None = None
    # The typed agent (define_agent's name) whose registration ``tool`` is: a client
    # whose registry has that agent rechecks the tool's ``enabled`` before answering.
    agent: str | None = None


class ConversationRequested(Event, tag="conversation_requested"):
    """A client asks to ``compact`` or ``reset`` the entity's agent conversation; the
    agent loop of the wake that takes it does it (see compaction.py)."""

    is_input: ClassVar[bool] = True
    action: Literal["compact", "reset"]
    by: str = "client"


class ActionSettled(Event, tag="action_settled"):
    """The answer to a pending action, with who gave it and when."""

    is_input: ClassVar[bool] = True
    tool_call_id: str
    # "skipped": the call is not run; the model gets a synthetic output saying so.
    decision: Literal["output", "failed", "cancelled", "approved", "denied", "expired", "skipped"]
    output: Any = None
    error: str | None = None
    edited_input: Any = None
    by: dict[str, str] | None = None
    at_ms: int = 0


class ToolData(Event, tag="tool_data"):
    """Public per-call state that renderers read, beside the call's input and output:
    written by the tool during ``execute`` (``ctx.set_data``, an output of the entity's
    commit) or by a client for a pending call (``rt.set_tool_data``, appended like a
    subscription: folded, it does not wake the entity). The latest write wins."""

    tool_call_id: str
    data: Any = None
    by: dict[str, str] | None = None  # the identity of a client's write (None: the tool)
    at_ms: int = 0


class RuntimeErrorRecorded(Event, tag="runtime_error"):
    """The full error of a bug that failed a run (a tool's exception, an ``on_output``
    that raised, an invalid output): for operators only. The gateway never sends it
    (clients see the redacted ``error`` of the run and of the tool result)."""

    is_output: ClassVar[bool] = True
    run_id: str
    error: str  # the redacted message clients see
    detail: str  # the full error (traceback), secrets included
    tool_call_id: str = ""
    tool: str = ""
    at_ms: int = 0


class ConversationCompacted(Event, tag="compaction"):
    """The conversation was shortened (context management; see compaction.py).

    It replaces the first ``replaced`` events of the journal (``SystemState.history``,
    which may begin with an earlier compaction): ``compact`` by the model's
    ``summary`` of them, ``trim`` and ``reset`` by nothing but a note. The log keeps
    every event it replaces; only the conversation sent to the model starts here.
    """

    is_output: ClassVar[bool] = True
    mode: Literal["compact", "trim", "reset"]
    replaced: int
    summary: str | None = None
    turns: int = 0  # user turns replaced, counting those an earlier compaction replaced
    reason: str = ""  # "budget", "prompt too long", "requested"
    tokens_before: int = 0  # the estimate of the conversation before it
    usage: dict[str, int] = {}  # of the summarising call
    run_id: str | None = None  # the run it was made in, if any
    taken_upto: str = ""  # the last input id the replaced user turns took (never taken again)
    request: str = ""  # the id of the conversation_requested input it answers, if any


class RunFailedNote(Event, tag="turn_failed"):
    """A run failed before the model answered its user turn: the projection closes the
    turn with a note, so the next message does not pile onto it."""

    is_output: ClassVar[bool] = True
    run_id: str
    error: str = ""
    # The API refused a request of the run as invalid (a 400): the projection leaves out
    # what the run added (its tool results, its images and documents; the text of its
    # user turns stays), so the next run does not send the offending content again.
    withdrawn: bool = False


class ModelRetryWait(Event, tag="model_retry_wait"):
    """A model call of the open run failed transiently (overloaded, rate limited, ...)
    after the SDK's own retries: the run suspends until ``due_ms`` (a durable timer
    wakes the entity with a :class:`ModelRetryDue`), then makes the step again.
    ``since_ms`` is when the first failure of this series happened: the run fails once
    the waits would pass the agent's ``model_retry_total_s``."""

    is_output: ClassVar[bool] = True
    run_id: str
    attempt: int  # failed attempts of the step so far (1 for the first wait)
    due_ms: int
    since_ms: int
    error: str = ""
    retry_after_s: float | None = None  # the server's ``retry-after``, if it sent one


class ModelRetryDue(Event, tag="model_retry_due"):
    """The timer of a :class:`ModelRetryWait` fired: the run may call the model again."""

    is_input: ClassVar[bool] = True
    run_id: str
    attempt: int = 0


HistoryEvent = (
    UserTurn
    | AssistantStep
    | ToolIntent
    | ToolOutcome
    | ConversationCompacted
    | RunFailedNote
    | ModelRetryWait
)


AnyEvent = (
    Created
    | Message
    | ChildRunFinished
    | Changed
    | CancelRequested
    | DeleteRequested
    | DeliveryFailed
    | Subscribed
    | Resumed
    | StateChanged
    | Outbox
    | TimerFired
    | RunStarted
    | RunFinished
    | MessageHeld
    | UserTurn
    | AssistantStep
    | ToolIntent
    | ToolOutcome
    | ConversationCompacted
    | RunFailedNote
    | ModelRetryWait
    | ModelRetryDue
    | ConversationRequested
    | ActionRequested
    | ActionSettled
    | ToolData
    | RuntimeErrorRecorded
    | HandlerFailed
    | EntityFailed
)


__all__ = [
    "ActionRequested",
    "ActionSettled",
    "AnyEvent",
    "AssistantStep",
    "CancelRequested",
    "Changed",
    "ChildRunFinished",
    "ConversationCompacted",
    "ConversationRequested",
    "Created",
    "DeleteRequested",
    "DeliveryFailed",
    "Effect",
    "EntityFailed",
    "Event",
    "HandlerFailed",
    "HistoryEvent",
    "Message",
    "MessageHeld",
    "ModelRetryDue",
    "ModelRetryWait",
    "Op",
    "Outbox",
    "Resumed",
    "RunEnd",
    "RunFailedNote",
    "RunFinished",
    "RunStarted",
    "RunStatus",
    "RuntimeErrorRecorded",
    "StateChanged",
    "Subscribed",
    "Subscription",
    "TimerFired",
    "ToolCall",
    "ToolData",
    "ToolIntent",
    "ToolOutcome",
    "UserTurn",
]
