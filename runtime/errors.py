"""Every error Wakeful raises, in one place.

Each error names the input that failed and why, so a caller never has to read a
stack trace to learn what to fix. Everything a public method raises on purpose
derives from :class:`WakefulError`; the interruptions of a wake derive from
``BaseException`` so that a handler's (or a tool's) ``except Exception`` cannot
swallow them (like trio's ``Cancelled``). The hierarchy::

    Exception
    +-- WakefulError
    |   +-- InvalidUrlError (ValueError)
    |   +-- InvalidTypeNameError (ValueError)
    |   +-- DuplicateTypeError (ValueError)
    |   +-- UnknownEntityTypeError (LookupError)
    |   +-- PayloadTooLargeError (ValueError)
    |   +-- InvalidPayloadError (TypeError)
    |   |   +-- InvalidEventError             a field of the wrong type: nothing written
    |   |   |   +-- InvalidIdempotencyKeyError  not text, or too long: nothing written
    |   |   +-- InvalidContentError           a content block the API would refuse: nothing written
    |   +-- EventDecodeError
    |   |   +-- UnreadableHistoryError
    |   +-- SnapshotError                     the snapshot cannot be read: state unknown
    |   |   +-- ConversationChunkError        a snapshot's conversation chunk is missing
    |   |   +-- MetadataError                 a position in the metadata cannot be read
    |   +-- CollectionError
    |   |   +-- UnknownCollectionError (AttributeError)
    |   |   +-- RowValidationError (ValueError)
    |   |   +-- DuplicateKeyError (ValueError)
    |   |   +-- MissingKeyError (LookupError)
    |   +-- EntityNotFoundError (LookupError)
    |   +-- NotFailedError                    resume of an entity that is not failed
    |   +-- ArgsConflictError (ValueError)
    |   +-- OwnerChangedError                 the owner an authoriser saw changed: nothing written
    |   +-- InvalidArgsError (ValueError)
    |   +-- FencedError
    |   +-- RedisFullError (MemoryError)      Redis at maxmemory: nothing was written
    |   +-- ReplicaWaitError                  written, but fewer replicas confirmed than asked
    |   +-- ArchiveError                      the archive hook refused entries: none trimmed
    |   +-- ConfigError (ValueError)
    |   +-- OutputError (OSError)             the CLI cannot write its output (a full disk)
    |   +-- WaitTimeoutError (TimeoutError)
    |   +-- RunSuspendedError
    |   +-- RunFailedError                    ask: the run did not complete (``status``)
    |   |   +-- RunTruncatedError             the answer was cut off (max_tokens, ...)
    |   |   +-- RunRefusedError               the model refused (stop reason refusal)
    |   +-- ActionError                       answers to pending tool actions
    |   |   +-- ActionNotPendingError (LookupError)
    |   |   +-- ActionNotAuthorizedError (PermissionError)
    |   |   +-- ActionValidationError (ValueError)
    |   |   +-- ToolDisabledError             the tool is disabled now: the call stays pending
    |   +-- ClientToolsError (ValueError)
    |   +-- InvalidScheduleError (ValueError)    a recurring schedule's id, cron or zone
    |   +-- ModelError                        a model call failed (``retryable``)
    |   +-- ModelConfigError (ValueError)
    |   |   +-- MissingAPIKeyError            no ANTHROPIC_API_KEY: an agent's runs fail at once
    |   +-- InvalidBlockError (ValueError)    a content block the Messages API would refuse
    |   +-- ContextConfigError (ValueError)   a bad context-management option of an agent
    |   +-- ConversationError                 a conversation cannot be compacted or reset now
    |   +-- ToolContractError (TypeError)
    |   +-- ToolFailure                       a tool's planned failure (``ctx.fail``)
    |   +-- ToolBugError                      a tool broke: the run fails
    |   +-- HTTPError                         the gateway refuses a request (``status``)
    +-- TargetMissingError                    engine-internal: never reaches a caller
    +-- EntityGoneError                       engine-internal: never reaches a caller
    +-- NotSentError                          engine-internal: never reaches a caller
    BaseException
    +-- WakeInterrupted                       lease lost or worker stopping

Private control flow that never leaves its layer (the agent loop's ``SuspendRun``
and ``StopRun``, the worker's retry) stays where it is raised, and so does a ready-made tool's own error (``CalculationError``, which the
calculator turns into an error result for the model).
"""

from __future__ import annotations

from typing import Any


def describe(exc: BaseException) -> str:
    """``"<type>: <message>"`` for a log line. Not ``repr``: redis-py 8 gives its errors a
    ``repr`` without their message (``server:ResponseError``), which left a worker's
    warning saying that a call failed but not why."""
    return f"{type(exc).__name__}: {exc}"


class WakefulError(Exception):
    """Base class of all Wakeful errors."""


class InvalidUrlError(WakefulError, ValueError):
    """An entity URL (or one of its parts) does not follow the URL rules."""

    def __init__(self, value: object, part: str, reason: str) -> None:
        self.value = value
        self.part = part
        self.reason = reason
        super().__init__(f"invalid entity {part} {value!r}: {reason}")


class InvalidTypeNameError(WakefulError, ValueError):
    """An entity type name is malformed."""


class DuplicateTypeError(WakefulError, ValueError):
    """An entity type with this name is already registered."""


class UnknownEntityTypeError(WakefulError, LookupError):
    """The entity type is not registered."""

    def __init__(self, type_name: str, known: list[str] | None = None) -> None:
        self.type_name = type_name
        hint = f"; registered types: {', '.join(sorted(known))}" if known else ""
        super().__init__(f"unknown entity type {type_name!r}{hint}")


class PayloadTooLargeError(WakefulError, ValueError):
    """An event is larger than the configured ``max_event_bytes``."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"{what} is {size} bytes, over the limit of {limit} bytes")


class InvalidPayloadError(WakefulError, TypeError):
    """A payload cannot be encoded as msgpack."""


class InvalidEventError(InvalidPayloadError):
    """An event whose fields do not match its type: it could not be read back, so it
    is refused before anything is written (``field`` names the field)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InvalidIdempotencyKeyError(InvalidEventError):
    """An idempotency key that is not text of at most
    :data:`~wakeful.keys.MAX_IDEMPOTENCY_KEY` characters (it becomes part of a Redis
    key kept for ``idempotency_ttl_s``): nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "idempotency_key")


class InvalidContentError(InvalidPayloadError):
    """Content blocks of a message (images, documents, text) the Messages API would
    refuse: refused before anything is written; ``block`` names the one at fault
    (``content[1]``)."""

    def __init__(self, message: str, block: str = "") -> None:
        super().__init__(message)
        self.block = block


class EventDecodeError(WakefulError):
    """A stored event could not be decoded. Carries the stream id."""

    def __init__(self, stream_id: str, url: str, reason: str) -> None:
        self.stream_id = stream_id
        self.url = url
        self.reason = reason
        super().__init__(f"event {stream_id} of {url} could not be decoded: {reason}")


class SnapshotError(WakefulError):
    """The entity's snapshot cannot be read (not a snapshot, truncated, or of a newer
    version), so its state is unknown: readers raise this rather than a decoder's
    error, and a worker parks the entity with it. Only a hand-edited or damaged
    keyspace shows this."""

    def __init__(self, reason: str, url: str = "") -> None:
        self.reason = reason
        self.url = url
        super().__init__(f"the state of {url} cannot be read: {reason}" if url else reason)


class ConversationChunkError(SnapshotError):
    """A snapshot references a conversation chunk that is missing or unreadable, so
    the state is unknown (the commit that writes a snapshot writes its chunks in the
    same script, so only a hand-edited or damaged keyspace shows this)."""


class MetadataError(SnapshotError):
    """Fields of the entity's metadata hash that say where its state stands (the
    cursor, the outbox marks) cannot be read, so its state is unknown: readers raise
    this, naming the fields, instead of a parser's error. Only a hand-edited or damaged
    keyspace shows this (a worker parks the entity with the same words)."""


class UnreadableHistoryError(EventDecodeError):
    """Entries at or before the cursor cannot be decoded, and no operator dead-lettered
    them: the state they are part of is unknown."""

    def __init__(self, errors: list[EventDecodeError]) -> None:
        self.errors = errors
        self.stream_ids = [e.stream_id for e in errors]
        first = errors[0]
        super().__init__(first.stream_id, first.url, first.reason)
        more = (
            f" (and {len(errors) - 1} more: {', '.join(self.stream_ids[1:])})" if errors[1:] else ""
        )
        self.args = (f"{first}{more}",)


class CollectionError(WakefulError):
    """Base class for collection errors (schema, keys, unknown collection)."""


class UnknownCollectionError(CollectionError, AttributeError):
    pass


class RowValidationError(CollectionError, ValueError):
    def __init__(self, collection: str, reason: str) -> None:
        self.collection = collection
        super().__init__(f"row rejected by collection {collection!r}: {reason}")


class DuplicateKeyError(CollectionError, ValueError):
    def __init__(self, collection: str, key: object) -> None:
        self.collection = collection
        self.key = key
        super().__init__(f"collection {collection!r} already has a row with key {key!r}")


class MissingKeyError(CollectionError, LookupError):
    def __init__(self, collection: str, key: object) -> None:
        self.collection = collection
        self.key = key
        super().__init__(f"collection {collection!r} has no row with key {key!r}")


class EntityNotFoundError(WakefulError, LookupError):
    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"entity {url} does not exist")


class NotFailedError(WakefulError):
    """``resume`` of an entity that is not failed (or was resumed by someone else)."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"entity {url} is not failed; nothing to resume")


class ArgsConflictError(WakefulError, ValueError):
    """An entity was created again with different args."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"entity {url} already exists with different args")


class OwnerChangedError(WakefulError):
    """A write that expected the entity's owner to be what an authoriser saw found
    another (the entity was created, deleted or re-created meanwhile): nothing was
    written, and the caller decides again with ``seen``."""

    def __init__(self, url: str, seen: str) -> None:
        self.url = url
        self.seen = seen  # the owner now: "!" missing, "~" none, "=<identity JSON>"
        super().__init__(f"the owner of {url} changed while the request was checked")


class InvalidArgsError(WakefulError, ValueError):
    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(f"args rejected by entity type {type_name!r}: {reason}")


class FencedError(WakefulError):
    """A commit was refused because the worker no longer holds the partition lease."""


class RedisFullError(WakefulError, MemoryError):
    """Redis refused a write because it is at its ``maxmemory`` (policy ``noeviction``).

    Nothing of the refused call was written (a script's first write is the one
    refused, see ``lua.py``); retry once memory is freed or ``maxmemory`` raised."""

    def __init__(self, detail: str = "") -> None:
        self.detail = detail
        super().__init__(
            "Redis is full: it refused the write because it reached its maxmemory limit "
            "(nothing was written; free memory or raise maxmemory, then retry)"
            + (f" [{detail}]" if detail else "")
        )


class ReplicaWaitError(WakefulError):
    """A write went through on its master, but fewer replicas than the replica wait
    asks for (``replica_wait``) confirmed it in time: a failover now could lose it.
    Retrying with the same idempotency key is safe (it is not applied twice)."""

    def __init__(
        self, script: str, confirmed: int, wanted: int, timeout_ms: int, reply: Any = None
    ) -> None:
        super().__init__(
            f"the {script.lower()} was written on its master, but only {confirmed} of "
            f"{wanted} replicas confirmed it within {timeout_ms} ms (setting "
            "replica_wait): it could be lost if the master fails now; retry with the "
            "same idempotency key, or check the replicas' links"
        )
        self.confirmed = confirmed
        self.wanted = wanted
        self.reply = reply  # the script's own reply (it was applied)


class ArchiveError(WakefulError):
    """The archive hook (the exporter of trimmed log entries) failed: the entries it
    was given stay in the log, and the trim is tried again later."""

    def __init__(self, url: str, cause: BaseException) -> None:
        self.url = url
        self.cause = cause
        super().__init__(
            f"archiving the log entries of {url} before trimming them failed: "
            f"{describe(cause)} (nothing was trimmed)"
        )


class ConfigError(WakefulError, ValueError):
    """Settings are invalid or disagree with what the Redis keyspace was set up with."""


class OutputError(WakefulError, OSError):
    """The CLI cannot write its output, to a file or to standard output (a full disk, an
    I/O error). A reader that closed the pipe is not one: that stays BrokenPipeError."""


class WaitTimeoutError(WakefulError, TimeoutError):
    pass


class RunSuspendedError(WakefulError):
    """The run waits for pending actions (client tools, approvals) instead of finishing."""

    def __init__(self, url: str, tool_call_ids: list[str]) -> None:
        self.url = url
        self.tool_call_ids = tool_call_ids
        super().__init__(
            f"the run of {url} is suspended, waiting for actions on tool calls "
            f"{', '.join(tool_call_ids)} (see rt.pending_actions)"
        )


class RunFailedError(WakefulError):
    """The run that answered ``ask`` failed, was cancelled, or ended without a whole
    answer (``status`` ``truncated`` or ``refused``: see the subclasses)."""

    def __init__(
        self,
        url: str,
        status: str,
        error: str | None,
        *,
        response: str | None = None,
        stop_reason: str | None = None,
    ) -> None:
        self.url = url
        self.status = status
        self.error = error
        self.response = response  # what the model did answer (truncated, refused)
        self.stop_reason = stop_reason
        super().__init__(f"the run of {url} {status}: {error or 'no error given'}")


class RunTruncatedError(RunFailedError):
    """The model's answer was cut off (``max_tokens``, ``model_context_window_exceeded``);
    ``response`` holds the part it gave."""


class RunRefusedError(RunFailedError):
    """The model refused to answer (stop reason ``refusal``)."""


# -- pending tool actions (client-routed tools and approvals; see actions.py) ----------


class ActionError(WakefulError):
    """An answer to a pending action was refused; the action is unchanged."""


class ActionNotPendingError(ActionError, LookupError):
    """The tool call has no pending action (unknown, or answered already)."""


class ActionNotAuthorizedError(ActionError, PermissionError):
    """The answering identity may not answer this action."""


class ActionValidationError(ActionError, ValueError):
    """A submitted output or an edited input does not match the tool's schema."""


class ToolDisabledError(ActionError):
    """An output or an approval for a call whose tool is disabled now (its ``enabled``
    says so, rechecked at answer time): refused, the action stays pending; it can
    still be cancelled, failed or skipped."""


class ClientToolsError(WakefulError, ValueError):
    """A snapshot of client tool definitions sent with a message is malformed."""


class InvalidScheduleError(WakefulError, ValueError):
    """A recurring schedule's ``field`` (id, expression, timezone, payload) is invalid,
    or the entity's schedule limit is reached."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid schedule {field} {value!r}: {reason}")


# -- models ------------------------------------------------------------------------------


class ModelError(WakefulError):
    """A model call failed. ``retryable`` tells whether calling again could help."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        model: str = "",
        status_code: int | None = None,
        error_type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.retryable = retryable
        self.model = model
        self.status_code = status_code
        self.error_type = error_type
        self.retry_after = retry_after  # seconds, from the response's retry-after header
        super().__init__(message)

    @property
    def invalid_request(self) -> bool:
        """The API refused the request itself as invalid (a 400): sending it again fails
        again."""
        return self.status_code == 400 and self.error_type == "invalid_request_error"


class ModelConfigError(WakefulError, ValueError):
    """A model cannot be built: unknown name, missing API key."""


class MissingAPIKeyError(ModelConfigError):
    """No API key for a Claude model (``ANTHROPIC_API_KEY`` is not set). An agent built
    on such a model fails each run at once with this message (nothing to retry)."""


class ContextConfigError(WakefulError, ValueError):
    """An agent's context-management option (``context_window``, ...) is invalid."""


class InvalidBlockError(WakefulError, ValueError):
    """A content block (a tool's output, ``to_model_output``) that the Messages API would
    refuse: an unsupported image type, too large, empty text, an unknown block type.
    Checked before the block is journaled, so it never poisons the conversation."""


class ConversationError(WakefulError):
    """A conversation cannot be compacted or reset now (e.g. a run waits on a tool)."""


# -- tools -------------------------------------------------------------------------------


class ToolContractError(WakefulError, TypeError):
    """A tool or agent definition is inconsistent (found when the agent is resolved)."""


class ToolFailure(WakefulError):
    """A planned failure (``ctx.fail``): the model sees it as a failed result."""

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class ToolBugError(WakefulError):
    """A tool broke (not a planned failure): the run fails. ``public`` is what clients
    see; ``detail`` (the full error, a traceback) is for operators only: the agent's
    ``on_runtime_error`` hook, the worker log, and a ``runtime_error`` event that the
    gateway never sends (see ``Runtime.runtime_errors``)."""

    def __init__(self, public: str, detail: str, *, tool: str = "", tool_call_id: str = "") -> None:
        super().__init__(public)
        self.public = public
        self.detail = detail
        self.tool = tool
        self.tool_call_id = tool_call_id


class HTTPError(WakefulError):
    """The gateway refuses a request: ``status`` is the HTTP status, ``kind`` the
    error type its JSON body names (``{"error": {"type": kind, "message": ...}}``)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


# -- engine-internal signals (plain exceptions: they never reach a caller) ---------------


class TargetMissingError(Exception):
    """A delivery that must not create its target found no entity there."""


class EntityGoneError(Exception):
    """The entity was deleted (or deleted and re-created) while a wake ran."""


class NotSentError(Exception):
    """A send pipelined behind its sender's commit did not run: the commit, or a send
    before it in the same round trip, was not applied (see ``Store.commit``)."""


# -- interruptions: BaseException, so that ``except Exception`` cannot swallow them -------


class WakeInterrupted(BaseException):
    """The wake must stop without committing (lease lost, worker shutting down).

    The worker leaves the inputs unacknowledged; the run resumes elsewhere. It
    derives from ``BaseException``: a handler or a tool that catches ``Exception``
    around ``ctx.agent.run()`` lets it through, so a lost lease still ends the wake.
    """
