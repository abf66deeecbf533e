"""The ``wakeful`` command line.

    wakeful demo                         the demo: a worker killed mid-run, resumed (embedded)
    wakeful worker APP                   run a worker for the registry APP (module:attr)
    wakeful serve APP                    the HTTP gateway and web console
    wakeful send URL TEXT [--file PATH]  send a message (with attachments), print its event id
    wakeful ask URL TEXT [--file PATH]   send a message and stream the reply
    wakeful tail URL [-f] [--live]       the entity log as a transcript (and live output)
    wakeful export URL [-o FILE]         the entity's current log as JSON Lines
    wakeful create URL [--args JSON]     create an entity (cancel, delete: end it)
    wakeful state URL, history URL       its collections; its agent journal
    wakeful submit URL CALL OUTPUT       answer a client tool call (fail: fail it)
    wakeful inspect URL                  status, lease, lag, state, children, actions
    wakeful ls [TYPE]                    entities (of a type) and their status
    wakeful pending URL                  tool calls waiting for a client or an approval
    wakeful approve URL CALL             approve a pending call (deny: refuse it; skip: not
                                         run, the model gets a synthetic output)
    wakeful set-data URL CALL JSON       set the tool data of a pending call
    wakeful resume URL [--skip-failed]   un-park a failed entity
    wakeful schedules URL                recurring schedules (--set ID CRON, --delete ID)
    wakeful bad                          pointers and timers the workers moved aside
    wakeful compact URL | reset URL      shorten an agent's conversation (summary / none)
    wakeful manifest APP                 the registry's manifest as JSON

The connection comes from ``--redis`` or ``WAKEFUL_REDIS_URL``; every other
setting from ``WAKEFUL_*`` variables (see README). Tables and colours on a
terminal, plain text when piped, JSON with ``--json``.

This module parses the arguments, dispatches to the subcommand and maps its errors
to exit codes; the subcommands live with their job: ``cli_processes`` (worker,
serve, demo, manifest), ``cli_messages`` (send, ask, tail, export), ``cli_actions``
(pending, approve, deny, skip, set-data), ``cli_entities`` (inspect, ls, resume,
schedules, compact, reset) and ``cli_admin`` (the operator's commands).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TextIO

import redis.exceptions

from . import cli_actions, cli_admin, cli_entities, cli_messages, cli_processes, terminal
from .cli_connect import client_of
from .cli_connect import load_registry as load_registry
from .cli_parser import BROKEN_PIPE, ERROR, INTERRUPTED, TIMED_OUT, UNREACHABLE, build_parser
from .cli_reply import PromptInterrupted
from .client import Runtime
from .connection import AUTHENTICATION_ERRORS, CLUSTER_ERRORS, UNREACHABLE_ERRORS
from .errors import (
    OutputError,
    RedisFullError,
    ReplicaWaitError,
    WaitTimeoutError,
    WakefulError,
)
from .redaction import RedactingFormatter, redact, redact_url, url_secrets
from .terminal import err

# Exit code 1 (ERROR) on connection.AUTHENTICATION_ERRORS: Redis is reachable, the URL's
# credentials are wrong. Exit code 6 (UNREACHABLE) on UNREACHABLE_ERRORS and CLUSTER_ERRORS:
# Redis did not answer, or a cluster is failing over or moving a slot.
Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def _admin(command: Callable[[Runtime, argparse.Namespace], Awaitable[int]]) -> Command:
    """A command of cli_admin, given a connected client (closed after it)."""

    async def run(args: argparse.Namespace) -> int:
        rt = await client_of(args)
        try:
            return await command(rt, args)
        finally:
            await rt.close()

    return run


COMMANDS: dict[str, Command] = {
    "demo": cli_processes.demo,
    "worker": cli_processes.worker,
    "serve": cli_processes.serve,
    "send": cli_messages.send,
    "ask": cli_messages.ask,
    "tail": cli_messages.tail,
    "export": cli_messages.export,
    "inspect": cli_entities.inspect,
    "ls": cli_entities.ls,
    "workers": _admin(cli_admin.workers),
    "pending": cli_actions.pending,
    "approve": cli_actions.approve,
    "deny": cli_actions.deny,
    "skip": cli_actions.skip,
    "set-data": cli_actions.set_data,
    "resume": cli_entities.resume,
    "create": _admin(cli_admin.create),
    "cancel": _admin(cli_admin.cancel),
    "delete": _admin(cli_admin.delete),
    "state": _admin(cli_admin.state),
    "history": _admin(cli_admin.history),
    "submit": _admin(cli_admin.submit),
    "fail": _admin(cli_admin.fail),
    "bad": _admin(cli_admin.bad),
    "schedules": cli_entities.schedules,
    "compact": cli_entities.conversation,
    "reset": cli_entities.conversation,
    "manifest": cli_processes.manifest,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    redis_url = getattr(args, "redis", None) or os.environ.get("WAKEFUL_REDIS_URL") or ""
    secrets = url_secrets(redis_url)
    _log_redacted(logging.INFO if args.verbose else logging.WARNING, secrets)
    if getattr(args, "redis", None) and secrets:
        err.print(
            "[yellow]warning: --redis shows the Redis password to every user of this "
            "machine (ps); set WAKEFUL_REDIS_URL instead[/]"
        )

    def error(text: str) -> None:  # every error text passes the redaction
        err.print(f"[red]error:[/] {terminal.escape(redact(text, secrets))}")

    stdout, sys.stdout = sys.stdout, GuardedStdout(sys.stdout)
    try:
        code = asyncio.run(COMMANDS[args.command](args))
        sys.stdout.flush()  # what is still buffered fails here, not at the exit
        return code
    except ReplicaWaitError as exc:  # written, not yet confirmed: worth a retry
        error(str(exc))
        return UNREACHABLE
    except WaitTimeoutError as exc:  # a --timeout passed (delete, compact, reset)
        error(str(exc))
        return TIMED_OUT
    except OutputError as exc:
        error(str(exc))
        _silence_stdout()  # what is left in its buffer would fail again at the exit
        return ERROR
    except WakefulError as exc:
        error(str(exc))
        return ERROR
    except AUTHENTICATION_ERRORS as exc:
        error(f"Redis refused the credentials of {redact_url(redis_url)}: {exc}")
        return ERROR
    except UNREACHABLE_ERRORS as exc:
        error(f"cannot reach Redis at {redact_url(redis_url)}: {exc}")
        return UNREACHABLE
    except CLUSTER_ERRORS as exc:  # a failover or a slot migration under way
        error(f"the Redis Cluster at {redact_url(redis_url)} is not serving now: {exc}")
        return UNREACHABLE
    except redis.exceptions.OutOfMemoryError as exc:  # a plain command, not a script
        err.print(f"[red]error:[/] {terminal.escape(str(RedisFullError(str(exc))))}")
        return ERROR
    except redis.exceptions.RedisError as exc:
        error(f"Redis refused: {exc}")
        return ERROR
    except (KeyboardInterrupt, PromptInterrupted):
        if args.command == "tail" and args.after:
            hint = redact(_resume_command(argv, args.after), secrets)
            err.print(f"resume with: {hint}", markup=False)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (`wakeful tail ... | head`): stop quietly
        _silence_stdout()
        return BROKEN_PIPE
    except Exception:  # a bug: its traceback, redacted like every other line printed
        err.print(redact(traceback.format_exc(), secrets), markup=False, highlight=False)
        return ERROR
    finally:
        sys.stdout = stdout


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush at the exit must not
    fail on what is still buffered for a reader that is gone or a disk that is full."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class GuardedStdout:
    """Standard output for the CLI: a write or flush it refuses (a full disk, an I/O
    error) is an :class:`OutputError` naming standard output, reported like every other
    error instead of as a traceback. A closed pipe stays ``BrokenPipeError`` (exit 141).
    Everything else is the wrapped stream's (Rich writes here too: its console reads
    ``sys.stdout`` at each print)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _stdout_failed(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _stdout_failed(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_failed(exc: OSError) -> OutputError:
    return OutputError(f"cannot write to standard output: {exc.strerror or exc}")


def _log_redacted(level: int, secrets: list[str]) -> None:
    """Log to stderr as ``logging.basicConfig`` would, every line redacted (a handler
    this set up before, in the same process, is replaced)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets)
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, RedactingFormatter)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def _resume_command(argv: Sequence[str] | None, after: str) -> str:
    """The same ``wakeful tail`` command line, continuing after ``after``."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--after" in words:
        at = words.index("--after")
        del words[at : at + 2]
    words = [w for w in words if not w.startswith("--after=")]
    return shlex.join(["wakeful", *words, "--after", after])


if __name__ == "__main__":
    sys.exit(main())
