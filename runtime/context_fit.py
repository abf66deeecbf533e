"""Whether an agent's runtime context fits the context a tool declares, and the value it gets.

A tool declares the context it needs (a class, a Struct, a dataclass or a
``Protocol``); an agent's ``runtime_context`` fits it when it is that type or a
subclass, or structurally: every field (or member) the tool needs, of a
compatible type. :func:`context_gap` says why one does not fit (checked when an
agent is defined), :func:`tool_context_value` is what the tool receives.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import msgspec

from .errors import ToolContractError, describe


def context_gap(provided: Any, needed: Any) -> str | None:
    """Why a runtime context of type ``provided`` cannot be handed to a tool that declares
    context ``needed``; ``None`` if it can.

    It can when it is that type or a subclass, or structurally: it has every field (or
    member, for a ``Protocol``) that ``needed`` requires, each of a compatible type. Never
    raises anything but :class:`ToolContractError`."""
    try:
        return _context_gap(provided, needed)
    except ToolContractError:
        raise
    except Exception as exc:  # a type hint that does not resolve, an odd type object
        raise ToolContractError(
            f"cannot compare the context {type_name(needed)} with {type_name(provided)}: "
            f"{describe(exc)}"
        ) from None


def _context_gap(provided: Any, needed: Any) -> str | None:
    if provided is None:
        return "no runtime_context resolver with a return annotation"
    if provided is needed or needed is Any:
        return None
    if not isinstance(needed, type):
        return f"{type_name(needed)} is not a class"
    if isinstance(provided, type) and not _is_protocol(needed) and issubclass(provided, needed):
        return None
    wanted = _fields(needed)
    have = _fields(provided) if isinstance(provided, type) else {}
    for name, (wanted_type, required) in wanted.items():
        if wanted_type is _METHOD:
            if not callable(getattr(provided, name, None)):
                return f"it has no method {name!r}"
            continue
        if name not in have:
            if required:
                return f"it has no field {name!r}"
            continue
        if not _type_fits(have[name][0], wanted_type):
            return f"its field {name!r} is {type_name(have[name][0])}, not {type_name(wanted_type)}"
    return None


_METHOD = object()  # the "type" of a method member of a Protocol


def _is_protocol(tp: Any) -> bool:
    return isinstance(tp, type) and bool(getattr(tp, "_is_protocol", False))


def _fields(tp: type) -> dict[str, tuple[Any, bool]]:
    """The fields a type declares: name -> (type, required)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return {f.name: (f.type, f.required) for f in msgspec.structs.fields(tp)}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return {
            f.name: (
                hints.get(f.name, Any),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(tp)
        }
    fields: dict[str, tuple[Any, bool]] = {}
    protocol = _is_protocol(tp)
    for base in reversed(tp.__mro__):
        if base in (object, typing.Generic) or getattr(base, "__module__", "") == "typing":
            continue
        hints = typing.get_type_hints(base)
        for name in inspect.get_annotations(base):
            if not name.startswith("_"):
                fields[name] = (hints.get(name, Any), protocol or not hasattr(base, name))
        if protocol:  # the methods a Protocol declares are members too
            for name, value in base.__dict__.items():
                if not name.startswith("_") and callable(value):
                    fields[name] = (_METHOD, True)
    return fields


def _type_fits(have: Any, wanted: Any) -> bool:
    """A value of type ``have`` is acceptable where ``wanted`` is declared."""
    if have == wanted or wanted is Any:
        return True
    wanted_arms = _union_arms(wanted)
    have_arms = _union_arms(have)
    if len(have_arms) > 1:
        return all(_type_fits(arm, wanted) for arm in have_arms)
    if len(wanted_arms) > 1:
        return any(_type_fits(have, arm) for arm in wanted_arms)
    if isinstance(have, type) and isinstance(wanted, type) and not _is_protocol(wanted):
        return issubclass(have, wanted)
    return False


def _union_arms(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def tool_context_value(needed: Any, runtime_context: Any) -> Any:
    """The value a tool that declares context ``needed`` receives from the agent's
    runtime context: the value itself for a ``Protocol`` or an instance of ``needed``;
    for a Struct or dataclass context met structurally, a copy with exactly its fields."""
    if needed is None:
        return None
    if not isinstance(needed, type) or _is_protocol(needed) or isinstance(runtime_context, needed):
        return runtime_context
    if issubclass(needed, msgspec.Struct) or dataclasses.is_dataclass(needed):
        return msgspec.convert(runtime_context, needed, from_attributes=True)
    return runtime_context


def type_name(value: Any) -> str | None:
    if value is None:
        return None
    return getattr(value, "__name__", repr(value))
