"""Whom a wake acts for, and which of its inputs may join the open run.

A run belongs to the identity that started it (``RunStarted.identity``): the
identity of the message that opened it, or, for a run opened by another input
(the entity's creation, a child's result, a timer), the entity's owner. Its pending actions are
answered by that identity, and what it sends and spawns carries it.

So a message of another identity never joins an open run. While a run is open,
such messages at the head of a wake's inputs are *held* (:class:`Split.held`): the
wake journals a ``message_held`` for each and moves the cursor past them, and
nothing else; when the run finishes, each is sent to the entity again and starts
a run of its own. A wake's inputs are otherwise cut before the first message of
another identity, so that the messages one wake hands its handler all belong to
one identity (the next wake holds them, or starts their run).
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import LogRecord, Message
from .state import SystemState

Identity = dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Split:
    """A wake's inputs, split by whom they belong to."""

    held: list[LogRecord]  # messages of another identity than the open run's: held only
    taken: list[LogRecord]  # the inputs the handler gets (a prefix of the wake's inputs)
    identity: Identity  # whom the wake acts for


def split_inputs(system: SystemState, inputs: list[LogRecord], owner: Identity) -> Split:
    """Split ``inputs`` for the entity whose runtime state is ``system`` and whose owner
    is ``owner`` (see the module docstring)."""
    if system.run is not None:
        identity = system.run_identity
        held = []
        for record in inputs:
            if not _foreign(record, identity):
                break
            held.append(record)
        if held:
            return Split(held, [], identity)
    elif inputs and isinstance(inputs[0].event, Message):
        identity = inputs[0].event.identity
    else:  # a creation, a child's result, a timer...: on behalf of the owner
        identity = owner
    taken = []
    for record in inputs:
        if _foreign(record, identity):
            break
        taken.append(record)
    return Split([], taken, identity)


def _foreign(record: LogRecord, identity: Identity) -> bool:
    return isinstance(record.event, Message) and record.event.identity != identity
