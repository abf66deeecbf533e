"""Metrics in the Prometheus text format (``prometheus-client``): what a worker did, and
where the keyspace stands.

Two kinds of families:

* **Counted** where it happens, in this process (one line at each place: the
  runner's attempt, the commit, the delivery, the lease sweep, the parking, the
  agent loop): wakes by outcome, wake duration and latency, commit latency,
  redeliveries, parkings, effects delivered, model tokens and errors, tool calls
  and errors. They live in :data:`REGISTRY`, Wakeful's own (not the client
  library's global one), so an app's metrics and ours do not collide.
* **Read from Redis** when scraped (:func:`render` takes a :class:`KeyspaceView`):
  inbox lag and pending pointers per partition, timers pending, leases held per
  worker, partitions without a live worker. Any process that reaches the Redis
  (the gateway, a worker) reports them the same.

``wakeful_wake_latency_seconds`` runs from the wake pointer's id (Redis's clock
when the work arrived) to the end of the activation, so it includes the time the
pointer waited in the inbox; clocks of Redis and the worker may differ a little.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .errors import ModelError
from .instrument import Call, around

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Histogram(Collector):
    """A histogram without labels, observed from one thread (a worker's event loop).

    ``prometheus_client.Histogram`` takes a lock for its sum and another for the
    bucket, and scans the buckets: three observations a wake made it a few percent of
    a one-message wake's CPU. Here an observation is a bisection and two additions. A
    second thread observing at the same moment could lose one count, never corrupt
    one; every observation in Wakeful is made on the worker's loop."""

    def __init__(
        self, name: str, documentation: str, *, buckets: Sequence[float], registry: Any
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(float(b) for b in buckets if b != math.inf)
        self._labels = [floatToGoString(b) for b in [*self._bounds, math.inf]]
        self._counts = [0] * (len(self._bounds) + 1)  # per bucket, not cumulative
        self._sum = 0.0
        registry.register(self)

    def observe(self, amount: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le)
        self._counts[bisect.bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation)
        cumulative, buckets = 0, []
        for label, count in zip(self._labels, self._counts, strict=True):
            cumulative += count
            buckets.append((label, float(cumulative)))
        family.add_metric([], buckets, self._sum)
        yield family


WAKES = Counter(
    "wakeful_wakes",
    "Activations of entities, by outcome (ok, retry, fenced, gone, interrupted, error)",
    ["outcome"],
    registry=REGISTRY,
)
WAKE_DURATION = Histogram(
    "wakeful_wake_duration_seconds",
    "Time of one activation: load, handler, commits and delivery",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
WAKE_LATENCY = Histogram(
    "wakeful_wake_latency_seconds",
    "From the wake pointer (Redis time) to the end of its activation",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
COMMIT_LATENCY = Histogram(
    "wakeful_commit_duration_seconds",
    "Time of one fenced commit script call",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
REDELIVERIES = Counter(
    "wakeful_redeliveries",
    "Wake pointers taken over from another owner (a new lease, or the sweep)",
    registry=REGISTRY,
)
PARKED = Counter(
    "wakeful_entities_parked", "Entities parked (status failed) by this process", registry=REGISTRY
)
EFFECTS_DELIVERED = Counter(
    "wakeful_effects_delivered", "Effects delivered, by kind", ["kind"], registry=REGISTRY
)
MODEL_TOKENS = Counter(
    "wakeful_model_tokens",
    "Tokens of model steps, by model and direction (input, output)",
    ["model", "direction"],
    registry=REGISTRY,
)
MODEL_ERRORS = Counter(
    "wakeful_model_errors",
    "Model requests that failed, by model and whether the wake retries them",
    ["model", "retryable"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter("wakeful_tool_calls", "Tool calls executed", ["tool"], registry=REGISTRY)
TOOL_ERRORS = Counter(
    "wakeful_tool_errors",
    "Tool calls that ended as an error result or raised a bug",
    ["tool"],
    registry=REGISTRY,
)


# What an activation that raises means for its pointers (runners.py decides; these
# are the exceptions' names, so this module needs nothing above errors.py).
_OUTCOMES = {
    "RetryLater": "retry",
    "FencedError": "fenced",
    "EntityGoneError": "gone",
    "CancelledError": "interrupted",
}


_wake_outcomes: dict[str, Counter] = {}  # the WAKES child of each outcome seen so far


def _wakes(outcome: str) -> Counter:
    child = _wake_outcomes.get(outcome)
    if child is None:
        child = _wake_outcomes[outcome] = WAKES.labels(outcome)
    return child


class _Timed:
    """A context manager that notes when it was entered; its ``__exit__`` records.

    A class rather than a ``@contextmanager`` generator: ``wake`` and ``commit`` are
    entered once a wake, and a generator's context manager costs several times as much."""

    __slots__ = ("_started",)

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started


class wake(_Timed):  # lowercase: used as ``with metrics.wake(...)``, as before
    """One activation, from the runner: its outcome, duration and latency."""

    __slots__ = ("_pointer_ids",)

    def __init__(self, pointer_ids: Sequence[str]) -> None:
        self._pointer_ids = pointer_ids

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outcome = "ok" if exc_type is None else _OUTCOMES.get(exc_type.__name__, "error")
        _wakes(outcome).inc()
        WAKE_DURATION.observe(self._elapsed())
        arrived: int | None = None
        for pointer_id in self._pointer_ids:
            ms = _id_ms(pointer_id)
            if ms is not None and (arrived is None or ms < arrived):
                arrived = ms
        if arrived is not None:
            WAKE_LATENCY.observe(max(time.time() - arrived / 1000, 0.0))


class commit(_Timed):  # lowercase: used as ``with metrics.commit():``, as before
    """One commit script call."""

    __slots__ = ()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        COMMIT_LATENCY.observe(self._elapsed())


@around
async def model_step(call: Call, agent: Any, args: tuple[Any, ...]) -> Any:
    """``Agent._step``: count the step's tokens, or the model's error."""
    model = agent.model.name
    try:
        result = await call()
    except Exception as exc:
        # The loop turns a final ModelError into its own failure (the cause).
        error = exc if isinstance(exc, ModelError) else exc.__cause__
        if isinstance(error, ModelError):
            MODEL_ERRORS.labels(model, str(error.retryable).lower()).inc()
        raise
    usage: Any = getattr(result, "usage", None)
    if usage is not None:
        MODEL_TOKENS.labels(model, "input").inc(usage.input_tokens)
        MODEL_TOKENS.labels(model, "output").inc(usage.output_tokens)
    return result


@around
async def tool_call(call: Call, calls: Any, args: tuple[Any, ...]) -> Any:
    """``ToolCalls._execute(run_id, call, tool, params)``: count the call, and a bug."""
    tool: Any = args[2]
    TOOL_CALLS.labels(tool.name).inc()
    try:
        return await call()
    except Exception:
        TOOL_ERRORS.labels(tool.name).inc()
        raise


def tool_result(tool: str, is_error: bool) -> None:
    """A tool call's result: an error result counts as a tool error."""
    if is_error:
        TOOL_ERRORS.labels(tool).inc()


def _id_ms(stream_id: str | bytes) -> int | None:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    head = text.split("-", 1)[0]
    return int(head) if head.isdigit() else None


# -- the keyspace, read when scraped --------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionView:
    partition: int
    inbox: int  # pointers in the inbox (acknowledged ones leave it)
    pending: int  # read by a worker, not yet acknowledged
    timers: int  # durable timers not yet fired


@dataclass(frozen=True, slots=True)
class KeyspaceView:
    """What :func:`render` reports of the keyspace, read from Redis by the caller."""

    partitions: list[PartitionView] = field(default_factory=list)
    leases: dict[int, str | None] = field(default_factory=dict)  # partition -> live holder


class _Keyspace(Collector):
    def __init__(self, view: KeyspaceView) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self.view
        families = {
            "inbox_lag": GaugeMetricFamily(
                "wakeful_inbox_lag",
                "Wake pointers no worker has read yet, per partition",
                labels=["partition"],
            ),
            "pending": GaugeMetricFamily(
                "wakeful_pending_pointers",
                "Wake pointers read but not yet acknowledged, per partition",
                labels=["partition"],
            ),
            "timers": GaugeMetricFamily(
                "wakeful_timers_pending", "Durable timers not yet fired", labels=["partition"]
            ),
        }
        for p in view.partitions:
            label = [str(p.partition)]
            families["inbox_lag"].add_metric(label, max(p.inbox - p.pending, 0))
            families["pending"].add_metric(label, p.pending)
            families["timers"].add_metric(label, p.timers)
        yield from families.values()
        held = GaugeMetricFamily(
            "wakeful_leases_held", "Partition leases held, per live worker", labels=["worker"]
        )
        counts: dict[str, int] = {}
        for holder in view.leases.values():
            if holder is not None:
                counts[holder] = counts.get(holder, 0) + 1
        for worker, n in sorted(counts.items()):
            held.add_metric([worker], n)
        yield held
        yield GaugeMetricFamily(
            "wakeful_partitions_unserved",
            "Partitions no live worker holds the lease of",
            value=sum(1 for h in view.leases.values() if h is None),
        )


def render(view: KeyspaceView) -> bytes:
    """The exposition text: this process's counters and the keyspace's gauges."""
    keyspace = CollectorRegistry(auto_describe=False)
    keyspace.register(_Keyspace(view))
    return generate_latest(REGISTRY) + generate_latest(keyspace)
