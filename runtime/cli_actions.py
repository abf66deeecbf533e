"""The ``wakeful`` command's answers to pending actions: ``pending``, ``approve``,
``deny``, ``skip``, ``set-data``.

An answer names the pending call and the caller's identity; with ``--follow`` the
command goes on to stream the reply the answer unblocks.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec

from . import terminal
from .actions import ActionNotAuthorizedError
from .cli_connect import client_of
from .cli_parser import OK
from .cli_reply import follow_reply, identity_of
from .errors import WakefulError
from .json_values import decode_json
from .terminal import out


async def pending(args: argparse.Namespace) -> int:
    rt = await client_of(args)
    try:
        await rt.status(args.url)
        pending = await rt.pending_actions(args.url)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json(pending)
    elif pending:
        out.print(terminal.actions_table(pending))
    else:
        out.print(f"{args.url} has no pending actions")
    return OK


async def approve(args: argparse.Namespace) -> int:
    edited = None
    if args.input is not None:
        edited = decode_json(args.input, "--input")  # strict: no NaN, no deep nesting
    return await _decide(args, "approved", edited_input=edited)


async def deny(args: argparse.Namespace) -> int:
    return await _decide(args, "denied")


async def set_data(args: argparse.Namespace) -> int:
    try:
        data = msgspec.json.decode(args.data)
    except msgspec.DecodeError as exc:
        raise WakefulError(f"the tool data is not JSON: {exc}") from None
    rt = await client_of(args)
    try:
        identity = identity_of(args)
        with _identity_hint(identity):
            event_id = await rt.set_tool_data(args.url, args.call, data, identity=identity)
    finally:
        await rt.close()
    if args.json:
        terminal.print_json({"url": args.url, "tool_call_id": args.call, "event_id": event_id})
    else:
        out.print(f"tool data of {args.call} of {args.url}: {event_id}")
    return OK


async def skip(args: argparse.Namespace) -> int:
    return await _decide(args, "skipped")


async def _decide(args: argparse.Namespace, decision: str, *, edited_input: Any = None) -> int:
    rt = await client_of(args)
    try:
        live_after = await rt.live_position(args.url)
        identity = identity_of(args)
        with _identity_hint(identity):
            if decision == "approved":
                event_id = await rt.approve(
                    args.url, args.call, edited_input=edited_input, identity=identity
                )
            elif decision == "skipped":
                event_id = await rt.skip_action(args.url, args.call, args.reason, identity=identity)
            else:
                event_id = await rt.deny(args.url, args.call, args.reason, identity=identity)
        if not args.follow:
            if args.json:
                terminal.print_json(
                    {"url": args.url, "tool_call_id": args.call, "event_id": event_id}
                )
            else:
                out.print(f"{decision} {args.call} of {args.url}: {event_id}")
            return OK
        return await follow_reply(rt, args, after=event_id, live_after=live_after)
    finally:
        await rt.close()


@contextlib.contextmanager
def _identity_hint(identity: dict[str, str] | None) -> Iterator[None]:
    """A refusal of an answer given without ``--identity`` says how to give one: a run
    started by an identity is answered by it."""
    try:
        yield
    except ActionNotAuthorizedError as exc:
        if identity:
            raise
        raise ActionNotAuthorizedError(
            f"{exc}; answer as the identity the run belongs to: --identity KEY=VALUE"
        ) from None
