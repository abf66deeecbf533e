"""Health and metrics over HTTP: ``/healthz``, ``/readyz`` and ``/metrics``.

The gateway mounts :func:`routes`; ``wakeful worker --metrics-port`` serves
:func:`app` on a port of its own. The three need no credentials (like
``/openapi.json``): they are for a load balancer, an orchestrator's probes and a
Prometheus scraper, and say nothing of any entity's data.

* ``/healthz``: the process is alive (and its worker, if it runs one, has not
  stopped): 200, or 503.
* ``/readyz``: Redis answers, every partition is leased by a live worker (so a
  message sent now is handled) and this process's worker, if any, has started:
  200, or 503 naming what is missing.
* ``/metrics``: the Prometheus text format (see metrics.py).
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import metrics
from .client import Runtime
from .errors import describe

PING_TIMEOUT_S = 2.0


def alive(runtime: Runtime) -> bool:
    """The process serves; a worker it runs has not stopped on its own."""
    worker = runtime.worker
    return worker is None or not worker.stopped.is_set()


async def readiness(runtime: Runtime) -> dict[str, Any]:
    """``{"ready", "redis", "unserved", "worker"}``: whether a message sent now is handled."""
    report: dict[str, Any] = {"ready": False, "redis": "ok", "unserved": []}
    try:
        store = runtime.store
        assert store is not None, "the runtime is not started"
        await store.redis.ping()
        owners = await runtime.partition_owners()
    except Exception as exc:  # Redis down, timed out, refused: not ready, and why
        report["redis"] = describe(exc)
        return report
    report["unserved"] = [p for p, owner in owners.items() if owner is None]
    worker = runtime.worker
    if worker is not None:
        report["worker"] = "ready" if worker.ready.is_set() else "starting"
        if worker.stopped.is_set():
            report["worker"] = "stopped"
    report["ready"] = not report["unserved"] and report.get("worker", "ready") == "ready"
    return report


async def keyspace_view(runtime: Runtime) -> metrics.KeyspaceView:
    """The keyspace's gauges, read from Redis."""
    store = runtime.store
    assert store is not None, "the runtime is not started"
    counts = await store.partition_counts()
    return metrics.KeyspaceView(
        partitions=[metrics.PartitionView(*c) for c in counts],
        leases=await runtime.partition_owners(),
    )


def routes(runtime: Runtime) -> list[Route]:
    """The three routes, for ``runtime``."""

    async def healthz(request: Request) -> Response:
        ok = alive(runtime)
        return JSONResponse(
            {"status": "alive" if ok else "stopped"}, status_code=200 if ok else 503
        )

    async def readyz(request: Request) -> Response:
        report = await readiness(runtime)
        return JSONResponse(report, status_code=200 if report["ready"] else 503)

    async def metrics_text(request: Request) -> Response:
        try:
            view = await keyspace_view(runtime)
        except Exception as exc:  # Redis unreachable: still report this process's counters
            return Response(
                metrics.render(metrics.KeyspaceView()),
                media_type=metrics.CONTENT_TYPE,
                headers={"X-Wakeful-Keyspace": f"unavailable: {type(exc).__name__}"},
            )
        return Response(metrics.render(view), media_type=metrics.CONTENT_TYPE)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]


def app(runtime: Runtime) -> Starlette:
    """A worker's own small HTTP server (``wakeful worker --metrics-port``)."""
    return Starlette(routes=routes(runtime))
