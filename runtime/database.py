"""``ctx.db``: a handler's views, typed handles and writes of its entity's collections.

:class:`Database` is what a handler gets as ``ctx.db``: :class:`Collections` to read
(a :class:`CollectionView` per declared collection, rows decoded on read so a caller
always gets a fresh copy), :class:`Actions` to write (validated, applied to the
in-memory :class:`~wakeful.state.EntityState` at once, and buffered as
:class:`~wakeful.events.Op` records until the next commit point), and
``collection(name, Row)``, the :class:`CollectionHandle` that does both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

import msgspec

from .errors import (
    CollectionError,
    DuplicateKeyError,
    MissingKeyError,
    RowValidationError,
    UnknownCollectionError,
)
from .events import Op
from .schema import Collection, RowT
from .scope import ALL, CURRENT_TOOL_CALL, take
from .state import EntityState, row_decoder

DefaultT = TypeVar("DefaultT")
RowI = TypeVar("RowI")  # a row type that is also written (invariant, unlike RowT)

_encoder = msgspec.msgpack.Encoder()


class CollectionView(Generic[RowT]):
    """Read access to one collection: ``get``, ``to_list``, ``len``, iteration, ``in``.

    ``RowT`` is the declared row type (``Any`` for free-form rows, and for the
    dynamic ``ctx.db.collections.<name>``); ``ctx.db.collection(name, Row)`` gives
    a :class:`CollectionHandle` of ``Row``, which a type checker can follow.
    """

    __slots__ = ("_decoder", "_name", "_table")

    def __init__(self, name: str, table: dict[Any, bytes], spec: Collection[RowT]) -> None:
        self._name = name
        self._table = table
        self._decoder = row_decoder(spec.row)

    @overload
    def get(self, key: Any) -> RowT | None: ...
    @overload
    def get(self, key: Any, default: DefaultT) -> RowT | DefaultT: ...
    def get(self, key: Any, default: Any = None) -> Any:
        data = self._table.get(key)
        return default if data is None else self._decoder.decode(data)

    def to_list(self) -> list[RowT]:
        return [self._decoder.decode(data) for data in self._table.values()]

    def keys(self) -> list[Any]:
        return list(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __iter__(self) -> Iterator[RowT]:
        return iter(self.to_list())

    def __repr__(self) -> str:
        return f"<collection {self._name}: {len(self._table)} rows>"


class Collections:
    """``ctx.db.collections``: one :class:`CollectionView` per declared collection,
    made when first asked for (most wakes read few of them, or none)."""

    def __init__(self, state: EntityState, specs: dict[str, Collection[Any]]) -> None:
        self._state = state
        self._specs = specs
        self._views: dict[str, CollectionView[Any]] = {}

    def __getattr__(self, name: str) -> CollectionView[Any]:
        view = self._views.get(name)
        if view is None:
            spec = self._specs.get(name)
            if spec is None:
                raise UnknownCollectionError(_unknown(name, self._specs))
            view = CollectionView(name, self._state.rows.setdefault(name, {}), spec)
            self._views[name] = view
        return view

    def __getitem__(self, name: str) -> CollectionView[Any]:
        return self.__getattr__(name)

    def _typed(self, name: str, row: type[RowT]) -> CollectionView[RowT]:
        """The view of ``name``, checked to hold rows of ``row`` (its declared row type).

        (Private: a public method would hide a collection of the same name.)"""
        view = self.__getattr__(name)
        declared = self._specs[name].row
        if declared is not row:
            raise CollectionError(
                f"collection {name!r} holds rows of "
                f"{declared.__name__ if declared is not None else 'free-form maps'}, "
                f"not {row.__name__}"
            )
        return view

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)


class CollectionHandle(CollectionView[RowI]):
    """``ctx.db.collection(name, Row)``: typed reads of one collection, and its writes.

    ``insert``, ``update`` and ``delete`` are ``ctx.db.actions.<name>_insert`` and the
    rest, with the row type a checker can follow.
    """

    __slots__ = ("_writes",)

    def __init__(self, view: CollectionView[RowI], writes: Actions) -> None:
        self._name, self._table, self._decoder = view._name, view._table, view._decoder
        self._writes = writes

    def insert(self, row: RowI) -> RowI:
        """Add ``row`` (raises DuplicateKeyError if its key is taken); returns it, validated."""
        inserted: RowI = self._writes._insert(self._name, row=row)
        return inserted

    def update(self, key: Any, updater: Callable[[RowI], RowI | None]) -> RowI:
        """Change the row under ``key`` in place (or return a new one); returns the new row."""
        updated: RowI = self._writes._update(self._name, key=key, updater=updater)
        return updated

    def delete(self, key: Any) -> None:
        """Remove the row under ``key`` (raises MissingKeyError if there is none)."""
        self._writes._delete(self._name, key=key)


def _unknown(name: str, known: dict[str, Any]) -> str:
    names = ", ".join(sorted(known)) or "none declared"
    return f"no collection named {name!r} (collections: {names})"


class Actions:
    """``ctx.db.actions``: ``<name>_insert``, ``<name>_update``, ``<name>_delete``.

    Each write is validated, applied to the in-memory state at once, and
    buffered until the next commit point.
    """

    def __init__(self, state: EntityState, specs: dict[str, Collection[Any]]) -> None:
        self._state = state
        self._specs = specs
        self.pending: list[tuple[str | None, Op]] = []  # (tool call, op); see scope.py

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        name, _, verb = attr.rpartition("_")
        if name not in self._specs or verb not in ("insert", "update", "delete"):
            raise UnknownCollectionError(
                f"no action {attr!r}: actions are <collection>_insert, _update and _delete; "
                + _unknown(name or attr, self._specs)
            )
        method = getattr(self, f"_{verb}")
        return lambda **kwargs: method(name, **kwargs)

    def take_pending(self, scope: str | None = ALL) -> list[Op]:
        """The buffered writes of ``scope`` (see scope.py), with repeated updates of a row
        folded into its first write.

        An update never moves a row, so folding it into the earlier insert or
        update of the same row keeps both the values and the row order that a
        fold of the log produces (deletes and inserts are kept as they are).
        """
        ops = take(self.pending, scope)
        out: list[Op] = []
        index: dict[tuple[str, Any], int] = {}
        for op in ops:
            slot = (op.collection, op.key)
            at = index.get(slot)
            if op.op == "update" and at is not None and out[at].op != "delete":
                out[at] = Op(out[at].op, op.collection, op.key, op.row)
            else:
                index[slot] = len(out)
                out.append(op)
        return out

    # -- the three writes --------------------------------------------------

    def _insert(self, collection: str, *, row: Any) -> Any:
        key, data, typed = self._validate(collection, row)
        table = self._state.rows.setdefault(collection, {})
        if key in table:
            raise DuplicateKeyError(collection, key)
        table[key] = data
        self.pending.append(
            (CURRENT_TOOL_CALL.get(), Op("insert", collection, key, msgspec.Raw(data)))
        )
        return typed

    def _update(self, collection: str, *, key: Any, updater: Callable[[Any], Any]) -> Any:
        table = self._state.rows.setdefault(collection, {})
        current = table.get(key)
        if current is None:
            raise MissingKeyError(collection, key)
        draft = self._decode(collection, current)
        result = updater(draft)
        new_row = draft if result is None else result
        new_key, data, typed = self._validate(collection, new_row)
        if new_key != key:
            raise RowValidationError(
                collection, f"an update may not change the primary key ({key!r} -> {new_key!r})"
            )
        table[key] = data
        self.pending.append(
            (CURRENT_TOOL_CALL.get(), Op("update", collection, key, msgspec.Raw(data)))
        )
        return typed

    def _delete(self, collection: str, *, key: Any) -> None:
        table = self._state.rows.setdefault(collection, {})
        if key not in table:
            raise MissingKeyError(collection, key)
        del table[key]
        self.pending.append((CURRENT_TOOL_CALL.get(), Op("delete", collection, key)))

    # -- helpers -------------------------------------------------------------

    def _decode(self, collection: str, data: bytes) -> Any:
        spec = self._specs.get(collection)
        return row_decoder(spec.row if spec is not None else None).decode(data)

    def _validate(self, collection: str, row: Any) -> tuple[Any, bytes, Any]:
        """Encode ``row``, decode it with the row type (full validation) and find its key."""
        spec = self._specs[collection]
        try:
            data = _encoder.encode(row)
        except (TypeError, ValueError, OverflowError) as exc:
            raise RowValidationError(collection, f"row cannot be encoded: {exc}") from exc
        try:
            typed = self._decode(collection, data)
        except msgspec.ValidationError as exc:
            raise RowValidationError(collection, str(exc)) from exc
        if spec.row is not None:
            key = getattr(typed, spec.primary_key)
        elif isinstance(typed, dict) and spec.primary_key in typed:
            key = typed[spec.primary_key]
        else:
            raise RowValidationError(
                collection, f"row must be a map with the primary key field {spec.primary_key!r}"
            )
        if not isinstance(key, str | int) or isinstance(key, bool):
            raise RowValidationError(
                collection, f"primary key {spec.primary_key!r} must be a str or int, got {key!r}"
            )
        return key, data, typed


class Database:
    """``ctx.db``: ``collections`` to read, ``actions`` to write.

    ``collection(name, Row)`` is the typed handle on one collection: a
    ``CollectionHandle[Row]`` (checked against the declaration) that reads and writes.
    """

    @overload
    def collection(self, name: str) -> CollectionHandle[Any]: ...
    @overload
    def collection(self, name: str, row: type[RowI]) -> CollectionHandle[RowI]: ...
    def collection(self, name: str, row: type[Any] | None = None) -> CollectionHandle[Any]:
        view = self.collections[name] if row is None else self.collections._typed(name, row)
        return CollectionHandle(view, self.actions)

    def __init__(self, state: EntityState, specs: dict[str, Collection]) -> None:
        self.collections = Collections(state, specs)
        self.actions = Actions(state, specs)
