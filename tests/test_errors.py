"""Errors live in one place: every error of errors.py (but the engine's internal signals)
is exported from ``wakeful``, and the interruptions of a wake escape ``except Exception``."""

from __future__ import annotations

import inspect

import pytest

import wakeful
from wakeful import errors

ENGINE_INTERNAL = {"TargetMissingError", "EntityGoneError", "NotSentError"}  # never reach a caller


def error_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }


def test_every_public_error_is_exported_from_the_root_and_drawn_in_the_hierarchy() -> None:
    classes = error_classes()
    public = set(classes) - ENGINE_INTERNAL
    assert public <= set(wakeful.__all__), sorted(public - set(wakeful.__all__))
    assert all(getattr(wakeful, name) is classes[name] for name in public)
    doc = errors.__doc__ or ""
    assert [name for name in classes if f"+-- {name}" not in doc] == []


def test_errors_raised_on_purpose_derive_from_wakeful_error() -> None:
    for name, cls in error_classes().items():
        if name in ENGINE_INTERNAL or name == "WakeInterrupted":
            continue
        assert issubclass(cls, wakeful.WakefulError), name


def test_an_interruption_is_not_an_exception() -> None:
    assert not issubclass(wakeful.WakeInterrupted, Exception)
    with pytest.raises(wakeful.WakeInterrupted):
        try:
            raise wakeful.WakeInterrupted("the partition lease was lost")
        except Exception:  # what a handler may well write around ctx.agent.run()
            pytest.fail("except Exception swallowed the interruption")
