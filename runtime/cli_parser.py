"""The ``wakeful`` command line's surface: its exit codes and arguments.

``cli.py`` runs the commands; this module only declares them (names, flags and
help texts, and what each exit code means), so the whole surface reads in one place.
"""

from __future__ import annotations

import argparse
import math

# Exit codes.
OK = 0
ERROR = 1  # reported by Wakeful: bad input, unknown entity, a refused answer
USAGE = 2  # argparse
RUN_FAILED = 3  # ask: the run failed or was cancelled, or the entity failed
SUSPENDED = 4  # ask/approve --follow: the run waits for an action nobody here can give
TIMED_OUT = 5  # a --timeout passed: ask not idle, delete not done, compact/reset not idle
UNREACHABLE = 6  # Redis did not answer, or a cluster is failing over (connection.py)
TRUNCATED = 7  # ask: the model's answer was cut off (max_tokens, context window full)
REFUSED = 8  # ask: the model refused to answer
INTERRUPTED = 130
BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a reader that closed the pipe


def seconds(text: str) -> float:
    """A ``--timeout``: a finite number of seconds, 0 or more. ``float()`` alone takes
    ``nan`` (a wait that never ends: no deadline compares past it), ``inf`` and
    negative numbers; they are usage errors instead."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, 0 or more")
    return value


def serve_limits(p: argparse.ArgumentParser) -> None:
    """``serve``'s Host allow-list and request limits (defaults: the WAKEFUL_* settings)."""
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="also answer to this Host name (repeatable; '*' for any). Default: the "
        "loopback names when bound to loopback, the address when bound to one",
    )
    for flag, kind, help_text in (
        ("--max-body-bytes", int, "largest request body (default 1048576)"),
        ("--max-header-bytes", int, "largest request line and headers (default 16384)"),
        ("--max-headers", int, "most headers of a request (default 100)"),
        ("--header-timeout", seconds, "seconds to send the request line and headers (default 10)"),
        ("--keep-alive", int, "seconds an idle connection stays open (default 5)"),
        ("--max-connections", int, "most open connections (default 256)"),
    ):
        p.add_argument(flag, type=kind, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wakeful",
        description="Durable actors for LLM agents",
        epilog="exit codes: 0 ok, 1 error, 2 usage, 3 run failed, 4 run suspended on an "
        "action, 5 timed out, 6 Redis unreachable, 7 answer truncated, 8 model refused, "
        "130 interrupted, 141 the reader of stdout went away (| head)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        name: str, help_text: str, *, redis: bool = True, json: bool = True
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if redis:
            p.add_argument(
                "--redis",
                help="Redis URL (default: $WAKEFUL_REDIS_URL, which keeps a password out of ps)",
            )
        if json:
            p.add_argument("--json", action="store_true", help="print JSON")
        return p

    def identity(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--identity",
            action="append",
            metavar="KEY=VALUE",
            help="the trusted identity to act as (repeatable), e.g. user=alice",
        )

    def follow_reply(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--timeout", type=seconds, default=120.0, help="seconds to wait for idle (default 120)"
        )
        p.add_argument(
            "--no-input", action="store_true", help="never prompt for approvals (exit 4 instead)"
        )

    command(
        "demo",
        "run the demo: workers on a shared embedded Redis, one killed mid-run (no Redis, "
        "no API key)",
        redis=False,
        json=False,
    )
    p = command("worker", "run a worker", json=False)
    p.add_argument("app", help="registry to run, as module:attribute")
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve /metrics, /healthz and /readyz on this port (default: not served)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="for --metrics-port")
    p = command(
        "serve", "serve entity URLs over HTTP, with the web console at /console/", json=False
    )
    p.add_argument("app", help="registry to serve, as module:attribute")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker", action="store_true", help="also run a worker in this process")
    p.add_argument(
        "--token",
        action="append",
        metavar="USER=TOKEN",
        help="accept Bearer TOKEN as USER (visible in ps: prefer --token-file or $WAKEFUL_TOKENS)",
    )
    p.add_argument(
        "--token-file", metavar="PATH", help="USER=TOKEN lines (# comments), one token a line"
    )
    p.add_argument(
        "--authorizer",
        metavar="POLICY",
        help="who may read and write which entity: 'owner' (the default with --token: an "
        "entity belongs to the identity that created it), 'allow-all' (the default "
        "without), or module:function",
    )
    serve_limits(p)

    def message(p: argparse.ArgumentParser) -> None:
        p.add_argument("url")
        p.add_argument("text", nargs="?", help="the message's text (optional with --file)")
        p.add_argument(
            "--file",
            "--attach",
            dest="files",
            action="append",
            metavar="PATH",
            help="attach an image (JPEG, PNG, GIF, WebP), a PDF or a text file (repeatable)",
        )
        p.add_argument("--idempotency-key")
        identity(p)

    p = command("send", "send a message to an entity (creating it)")
    message(p)
    p = command("ask", "send a message and stream the reply until the entity is idle")
    message(p)
    follow_reply(p)
    p = command(
        "tail", "the entity log as a transcript (--json: raw); -f follows, --live adds live output"
    )
    p.add_argument("url")
    p.add_argument("--after", help="start after this event id (resume)")
    p.add_argument("-f", "--follow", action="store_true", help="wait for new events")
    p.add_argument("--live", action="store_true", help="also text deltas and tool progress")
    p = command("export", "write the entity's current log as JSON Lines", json=False)
    p.add_argument("url")
    p.add_argument("-o", "--output", help="write to this file (default: stdout)")
    p = command("inspect", "status, lease owner, lag, state, children and pending actions")
    p.add_argument("url")
    p.add_argument("--app", help="registry, to decode collections with their row types")
    p = command("ls", "list entities (of one type) and their status")
    p.add_argument("type", nargs="?", help="entity type (default: every known type)")
    command("workers", "live workers, the partitions each holds, and partitions without one")
    p = command("pending", "tool calls of an entity waiting for a client or an approval")
    p.add_argument("url")
    for name, help_text in (
        ("approve", "approve a pending tool call"),
        ("deny", "deny a pending tool call"),
        ("skip", "skip a pending tool call: the model gets a synthetic output"),
    ):
        p = command(name, help_text)
        p.add_argument("url")
        p.add_argument("call", help="the tool call id (see wakeful pending)")
        if name == "approve":
            p.add_argument("--input", help="run the call with this JSON input instead")
        else:
            default = "denied" if name == "deny" else "skipped"
            p.add_argument("--reason", default=f"{default} by the operator")
        p.add_argument("--follow", action="store_true", help="stream the run as it resumes")
        identity(p)
        follow_reply(p)
    p = command("schedules", "list, set (--set) or delete (--delete) recurring schedules")
    p.add_argument("url")
    action = p.add_mutually_exclusive_group()
    action.add_argument(
        "--set",
        nargs=2,
        metavar=("ID", "CRON"),
        help="create or replace schedule ID with a 5-field cron expression, e.g. '0 9 * * 1-5'",
    )
    action.add_argument("--delete", metavar="ID", help="delete schedule ID")
    p.add_argument("--timezone", help="IANA time zone of --set (default UTC)")
    p.add_argument("--payload", help="the message of each occurrence of --set (text)")
    p = command("set-data", "set the tool data of a pending tool call (renderers read it)")
    p.add_argument("url")
    p.add_argument("call", help="the tool call id (see wakeful pending)")
    p.add_argument("data", help="the tool data, as JSON")
    identity(p)
    p = command("create", "create an entity (get-or-create), optionally with a first message")
    p.add_argument("url")
    p.add_argument("--args", metavar="JSON", help="the entity's args, as JSON")
    p.add_argument("--message", metavar="TEXT", help="a first message")
    p.add_argument("--idempotency-key")
    identity(p)
    p = command("cancel", "cancel the entity's current run (and its children, per policy)")
    p.add_argument("url")
    p.add_argument("--reason", default="cancelled by the operator")
    p = command("delete", "delete an entity (its run is cancelled, then every key removed)")
    p.add_argument("url")
    p.add_argument("--no-wait", action="store_true", help="do not wait for a worker to do it")
    p.add_argument("--timeout", type=seconds, default=30.0, help="seconds to wait (default 30)")
    p = command("state", "the entity's committed collections")
    p.add_argument("url")
    p = command("history", "the agent journal: user turns, steps, tool calls and results")
    p.add_argument("url")
    p = command("submit", "answer a client tool call with its output")
    p.add_argument("url")
    p.add_argument("call", help="the tool call id (see wakeful pending)")
    p.add_argument("output", help="the output, as JSON")
    identity(p)
    p = command("fail", "fail a client tool call")
    p.add_argument("url")
    p.add_argument("call", help="the tool call id (see wakeful pending)")
    p.add_argument("--error", default="failed by the operator")
    identity(p)
    command("bad", "wake pointers and timers the workers could not use and moved aside")
    p = command("resume", "un-park a failed entity")
    p.add_argument("url")
    p.add_argument("--skip-failed", action="store_true", help="dead-letter the failed inputs")
    for name, help_text in (
        ("compact", "summarise the older turns of an entity's agent conversation"),
        ("reset", "drop every turn of an entity's agent conversation before its open run"),
    ):
        p = command(name, help_text)
        p.add_argument("url")
        p.add_argument("--timeout", type=seconds, default=120.0, help="seconds to wait for it")
    p = command("manifest", "print the registry's manifest (always JSON)", redis=False)
    p.add_argument("app")
    return parser
