"""The ``wakeful`` command line.

    wakeful demo                         run the demo on the embedded default
    wakeful worker APP                   run a worker for the registry APP (module:attr)
    wakeful send URL TEXT                send a message, print its event id
    wakeful inspect URL                  status, state, children, pending actions
    wakeful ls TYPE                      entities of a type
    wakeful tail URL [--follow]          the entity log
    wakeful resume URL [--skip-failed]   un-park a failed entity
    wakeful manifest APP                 the registry's manifest as JSON

The connection comes from ``--redis`` or ``WAKEFUL_REDIS_URL``; every other
setting from ``WAKEFUL_*`` variables (see README). Exit codes: 0 ok, 1 error
reported by Wakeful (bad input, unknown entity), 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from .client import Runtime
from .config import Settings
from .errors import WakefulError
from .registry import Registry


def load_registry(spec: str) -> Registry:
    """Import ``module:attribute`` (attribute defaults to ``registry``)."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WakefulError(f"cannot import app module {module_name!r}: {exc}") from exc
    registry = getattr(module, attr or "registry", None)
    if not isinstance(registry, Registry):
        raise WakefulError(f"{spec!r} is not a Registry (expected module:attribute)")
    return registry


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(redis_url=getattr(args, "redis", None))


def _print(data: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(msgspec.to_builtins(data), indent=2, default=str))
    elif isinstance(data, dict):
        width = max((len(str(k)) for k in data), default=0)
        for key, value in data.items():
            print(f"{key:<{width}}  {value}")
    else:
        print(data)


async def _worker(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    settings = _settings(args)
    if settings.redis_url is None:
        raise WakefulError("wakeful worker needs a Redis: pass --redis or set WAKEFUL_REDIS_URL")
    rt = Runtime(registry, settings=settings, run_worker=True)
    await rt.start()
    assert rt.worker is not None
    # Long-lived process: move start-up objects out of the collector's way; full
    # collections otherwise pause a busy worker for ~10 ms at a time.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {rt.worker.id} running {', '.join(registry.names())}", flush=True)
    await stop.wait()
    print("shutting down: finishing running wakes", flush=True)
    await rt.close()
    return 0


async def _client(args: argparse.Namespace) -> Runtime:
    registry = load_registry(args.app) if getattr(args, "app", None) else Registry()
    settings = _settings(args)
    if settings.redis_url is None:
        raise WakefulError(
            f"wakeful {args.command} needs a Redis: pass --redis or set WAKEFUL_REDIS_URL"
        )
    return await Runtime(registry, settings=settings, run_worker=False).start()


async def _send(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        event_id = await rt.send(args.url, args.text, idempotency_key=args.idempotency_key)
        _print({"url": args.url, "event_id": event_id}, args.json)
    finally:
        await rt.close()
    return 0


async def _inspect(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        status = await rt.status(args.url)
        info = {
            **dataclasses.asdict(status),
            "state": await rt.state(args.url),
            "children": [msgspec.to_builtins(c) for c in await rt.children(args.url)],
            "pending_actions": [
                {"tool_call_id": a.tool_call_id, "tool": a.tool, "kind": a.kind, "input": a.input}
                for a in await rt.pending_actions(args.url)
            ],
        }
        _print(info, args.json)
    finally:
        await rt.close()
    return 0


async def _ls(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        urls = await rt.list(args.type)
        if args.json:
            _print(urls, True)
        else:
            for url in urls:
                print(url)
    finally:
        await rt.close()
    return 0


async def _tail(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        async for record in rt.events(args.url, after=args.after, follow=args.follow):
            data = msgspec.to_builtins(record, enc_hook=_raw_rows)
            print(json.dumps(data, default=str) if args.json else _line(data), flush=True)
    finally:
        await rt.close()
    return 0


def _raw_rows(value: Any) -> Any:
    """Rows of ``state`` events are stored encoded; show them decoded."""
    if isinstance(value, msgspec.Raw):
        return msgspec.msgpack.decode(value)
    raise TypeError(f"cannot show a {type(value).__name__}")


def _line(record: dict[str, Any]) -> str:
    event = record.get("event")
    if event is None:
        return f"{record['id']}  UNDECODABLE  {record.get('error')}"
    kind = event.pop("t", "?")
    event.pop("v", None)
    return f"{record['id']}  {kind:<14} {json.dumps(event, default=str)}"


async def _resume(args: argparse.Namespace) -> int:
    rt = await _client(args)
    try:
        await rt.resume(args.url, skip_failed=args.skip_failed)
        print(f"resumed {args.url}")
    finally:
        await rt.close()
    return 0


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .gateway import bearer_tokens, create_app

    registry = load_registry(args.app)
    settings = _settings(args)
    rt = Runtime(registry, settings=settings, run_worker=settings.redis_url is None or args.worker)
    await rt.start()
    tokens = dict(t.split("=", 1) for t in args.token or [])
    authenticate = (
        bearer_tokens({tok: {"user": user} for user, tok in tokens.items()}) if tokens else None
    )
    app = create_app(rt, authenticate=authenticate)
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    )
    print(f"serving {', '.join(registry.names())} on http://{args.host}:{args.port}", flush=True)
    try:
        await server.serve()
    finally:
        await rt.close()
    return 0


async def _manifest(args: argparse.Namespace) -> int:
    print(load_registry(args.app).manifest_json())
    return 0


async def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    await run_demo()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wakeful", description="Durable actors for LLM agents")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, *, redis: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        if redis:
            p.add_argument("--redis", help="Redis URL (default: $WAKEFUL_REDIS_URL)")
        p.add_argument("--json", action="store_true", help="print JSON")
        return p

    command("demo", "run the demo on the embedded default (no Redis, no API key)", redis=False)
    p = command("worker", "run a worker")
    p.add_argument("app", help="registry to run, as module:attribute")
    p = command("send", "send a message to an entity")
    p.add_argument("url")
    p.add_argument("text")
    p.add_argument("--idempotency-key")
    p.add_argument("--app", help="registry (module:attribute) to check the type against")
    p = command("inspect", "status and state of an entity")
    p.add_argument("url")
    p.add_argument("--app", help="registry, to decode collections with their row types")
    p = command("ls", "list the entities of a type")
    p.add_argument("type")
    p = command("tail", "print the entity log")
    p.add_argument("url")
    p.add_argument("--after", help="start after this event id")
    p.add_argument("-f", "--follow", action="store_true", help="wait for new events")
    p = command("resume", "un-park a failed entity")
    p.add_argument("url")
    p.add_argument("--skip-failed", action="store_true", help="dead-letter the failed inputs")
    p = command("serve", "serve entity URLs over HTTP")
    p.add_argument("app", help="registry to serve, as module:attribute")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker", action="store_true", help="also run a worker in this process")
    p.add_argument(
        "--token", action="append", metavar="USER=TOKEN", help="accept Bearer TOKEN as USER"
    )
    p = command("manifest", "print the registry's manifest", redis=False)
    p.add_argument("app")
    return parser


COMMANDS = {
    "demo": _demo,
    "worker": _worker,
    "send": _send,
    "inspect": _inspect,
    "ls": _ls,
    "tail": _tail,
    "resume": _resume,
    "manifest": _manifest,
    "serve": _serve,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except WakefulError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
