"""Connecting a command to its app and its Redis: the registry, the settings, a client.

Every subcommand that talks to a keyspace starts here: ``--redis`` or
``WAKEFUL_REDIS_URL`` checked, the app loaded by name (``module:attribute``), and a
client started without a worker (``worker`` and ``serve`` build their own).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import redis.exceptions

from .client import Runtime
from .config import Settings
from .connection import CLUSTER_SCHEMES
from .errors import WakefulError
from .redaction import redact_url
from .registry import Registry


def load_registry(spec: str) -> Registry:
    """Import ``module:attribute`` (attribute defaults to ``registry``), looking in the
    current directory first, as ``python -m`` and uvicorn do."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WakefulError(f"cannot import app module {module_name!r}: {exc}") from exc
    registry = getattr(module, attr or "registry", None)
    if not isinstance(registry, Registry):
        raise WakefulError(f"{spec!r} is not a Registry (expected module:attribute)")
    return registry


def settings_of(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env(redis_url=getattr(args, "redis", None))
    url = settings.redis_url
    schemes = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)
    if url is not None and not url.startswith(schemes):
        raise WakefulError(
            f"Redis URL {redact_url(url)!r} must start with redis://, rediss://, unix://, "
            "redis+cluster:// or rediss+cluster:// (from --redis or WAKEFUL_REDIS_URL)"
        )
    return settings


async def client_of(args: argparse.Namespace) -> Runtime:
    registry = load_registry(args.app) if getattr(args, "app", None) else Registry()
    settings = settings_of(args)
    if settings.redis_url is None:
        raise WakefulError(
            f"wakeful {args.command} needs a Redis: pass --redis or set WAKEFUL_REDIS_URL"
        )
    rt = Runtime(registry, settings=settings, run_worker=False)
    try:
        return await rt.start()
    except redis.exceptions.ConnectionError:
        await rt.close()
        raise
