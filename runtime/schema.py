"""What an entity type declares about its durable state: :class:`Collection`.

The declaration sits at the bottom of the handler API: the registry keeps it,
the state layer validates rows with it and ``ctx.db`` reads through it. It is
generic in its row type, so ``Collection(row=Note)`` is a ``Collection[Note]``
and a typed read (``ctx.db.collection("notes", Note)``) gives ``Note`` rows to a
type checker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

RowT = TypeVar("RowT", covariant=True)  # a Collection[Note] is a Collection[object]


@dataclass(frozen=True)
class Collection(Generic[RowT]):
    """A declared durable key/value collection of an entity type.

    ``row`` is an optional msgspec Struct type; every write is validated against
    it. Without it rows are free-form maps that must contain the primary key.
    """

    primary_key: str = "key"
    row: type[RowT] | None = None

    def row_schema(self) -> dict[str, Any] | None:
        return msgspec.json.schema(self.row) if self.row is not None else None
