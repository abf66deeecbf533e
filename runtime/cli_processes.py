"""The ``wakeful`` command's long-running processes: ``worker``, ``serve``, ``demo``.

Each builds its own :class:`~wakeful.client.Runtime` (with a worker, or the gateway
around it) and runs until a signal; ``manifest`` prints what an app registers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import signal

from . import cli_admin
from .cli_connect import load_registry, settings_of
from .cli_parser import OK
from .cli_tokens import TOKENS_VAR, load_tokens
from .client import Runtime
from .config import Settings
from .errors import WakefulError
from .heap import settle_for_long_run
from .redaction import redact_url
from .tasks import first_of
from .terminal import err


async def worker(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    settings = settings_of(args)
    if settings.redis_url is None:
        raise WakefulError("wakeful worker needs a Redis: pass --redis or set WAKEFUL_REDIS_URL")
    metrics_socket = cli_admin.listen(args.metrics_host, args.metrics_port)
    rt = Runtime(registry, settings=settings, run_worker=True)
    with err.status(f"starting a worker on {redact_url(settings.redis_url)}"):
        await rt.start()
    assert rt.worker is not None
    settle_for_long_run()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {rt.worker.id} running {', '.join(registry.names())}", flush=True)
    # Until a signal, or until the worker dies on its own (rt.close() raises its error).
    async with cli_admin.metrics_server(rt, metrics_socket):
        await first_of(stop.wait(), rt.worker.stopped.wait())
    if stop.is_set():
        print("shutting down: finishing running wakes", flush=True)
    await rt.close()
    return OK


async def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .authorization import load_authorizer
    from .gateway import bearer_tokens, create_app
    from .http_limits import allowed_hosts, server_config

    authorize = load_authorizer(args.authorizer) if args.authorizer else None
    registry = load_registry(args.app)
    settings = _serve_settings(args)
    hosts = allowed_hosts(args.host, args.allowed_host or ())
    if args.token:
        err.print(
            "[yellow]warning: --token shows the token to every user of this machine (ps); "
            f"use --token-file or {TOKENS_VAR}[/]"
        )
    tokens = load_tokens(args.token, args.token_file)
    # Bound first: a port in use ends the command before it starts a runtime or prints
    # its banner (uvicorn, binding it in serve(), would fail after both, with exit 3).
    sock = cli_admin.bind(args.host, args.port, "--port")
    rt = Runtime(registry, settings=settings, run_worker=settings.redis_url is None or args.worker)
    await rt.start()
    settle_for_long_run()
    app = create_app(
        rt,
        authenticate=bearer_tokens(tokens) if tokens else None,
        authorize=authorize,
        allowed_hosts=hosts,
    )
    server = uvicorn.Server(server_config(app, host=args.host, port=args.port, settings=settings))
    base = f"http://{args.host}:{sock.getsockname()[1]}"  # the port chosen, for --port 0
    policy = args.authorizer or ("owner" if tokens else "allow-all")
    print(
        f"serving {', '.join(registry.names())} on {base} "
        f"(console: {base}/console/; authorisation: {policy})",
        flush=True,
    )
    if hosts is None:
        print("answering to any Host name: pass --allowed-host NAME to restrict", flush=True)
    if rt.worker is None:
        live = await rt.workers()
        if live:
            print(
                f"no worker in this process; {len(live)} live worker(s) on "
                f"{redact_url(settings.redis_url or '')}",
                flush=True,
            )
        else:
            print(
                f"no worker runs on {redact_url(settings.redis_url or '')}: messages wait "
                "until one starts "
                "(`wakeful worker APP`, or serve with --worker)",
                flush=True,
            )
    try:
        await server.serve(sockets=[sock])
    finally:
        await rt.close()
        sock.close()
    return OK


def _serve_settings(args: argparse.Namespace) -> Settings:
    """The settings with serve's limit flags over them (a flag left out keeps the setting)."""
    flags = {
        "max_body_bytes": args.max_body_bytes,
        "max_header_bytes": args.max_header_bytes,
        "max_headers": args.max_headers,
        "header_timeout_s": args.header_timeout,
        "keep_alive_s": args.keep_alive,
        "max_http_connections": args.max_connections,
    }
    return dataclasses.replace(
        settings_of(args), **{k: v for k, v in flags.items() if v is not None}
    )


async def demo(args: argparse.Namespace) -> int:
    # The demo is an app like any other: loaded by name, so the library never imports
    # its own examples (wakeful.entities sits above every layer of the library).
    run_demo = importlib.import_module("wakeful.entities.demo").run_demo

    await run_demo()
    return OK


async def manifest(args: argparse.Namespace) -> int:
    print(load_registry(args.app).manifest_json())
    return OK
