"""Every error Wakeful raises on purpose derives from :class:`WakefulError`.

Each error names the input that failed and why, so a caller never has to read a
stack trace to learn what to fix.
"""

from __future__ import annotations


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


class EventDecodeError(WakefulError):
    """A stored event could not be decoded. Carries the stream id."""

    def __init__(self, stream_id: str, url: str, reason: str) -> None:
        self.stream_id = stream_id
        self.url = url
        self.reason = reason
        super().__init__(f"event {stream_id} of {url} could not be decoded: {reason}")


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


class ArgsConflictError(WakefulError, ValueError):
    """An entity was created again with different args."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"entity {url} already exists with different args")


class InvalidArgsError(WakefulError, ValueError):
    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(f"args rejected by entity type {type_name!r}: {reason}")


class FencedError(WakefulError):
    """A commit was refused because the worker no longer holds the partition lease."""


class ConfigError(WakefulError, ValueError):
    """Settings are invalid or disagree with what the Redis keyspace was set up with."""


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
    """The run that answered ``ask`` failed or was cancelled."""

    def __init__(self, url: str, status: str, error: str | None) -> None:
        self.url = url
        self.status = status
        self.error = error
        super().__init__(f"the run of {url} {status}: {error or 'no error given'}")
