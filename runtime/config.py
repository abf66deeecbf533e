"""Runtime settings, from keyword arguments or ``WAKEFUL_*`` environment variables."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .events import DEFAULT_MAX_EVENT_BYTES
from .redaction import redact_url


@dataclass(frozen=True)
class Settings:
    """Every knob of the runtime. ``Settings.from_env()`` reads ``WAKEFUL_<NAME>``.

    ``redis_url=None`` selects the embedded default: an in-process fakeredis.
    """

    redis_url: str | None = dataclasses.field(default=None, repr=False)  # see __repr__
    prefix: str = "wk"
    partitions: int = 16
    lease_ttl_ms: int = 5000
    # How often the worker renews its leases and heartbeats (0 = a third of the lease).
    # A long lease with a short interval survives long stalls of a loaded machine and
    # still notices a joining or leaving worker soon (handover waits for a heartbeat).
    heartbeat_interval_ms: int = 0
    # How long the worker's event loop may be stalled (a handler blocking it, a loaded
    # machine) while a thread of the worker keeps its leases (stall_guard.py); a loop
    # stalled longer lets them lapse, so a wedged process frees its partitions. 0: no
    # thread, the leases lapse after lease_ttl_ms of stall.
    stall_limit_ms: int = 300_000
    max_concurrency: int = 256
    read_count: int = 256
    block_ms: int = 500
    # The timer loop sleeps until the earliest timer it knows of (due_times.py); this
    # slow read of every owned partition's next due time is its safety net, for what
    # no hint told it (a client's schedule, a commit whose reply was lost).
    timer_poll_ms: int = 5000
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    max_attempts: int = 5
    retry_base_ms: int = 200
    retry_max_ms: int = 30_000
    snapshot_every: int = 1000
    # Log retention (retention.py): after a snapshot, entries it covers go once they
    # are older than retention_s and not among the newest retention_entries.
    retention_s: float = 86_400.0
    retention_entries: int = 100
    archive_dir: str | None = None  # trimmed entries are appended here as JSON Lines first
    # How often the worker's retention sweep (sweep.py) trims the logs of idle entities
    # whose entries aged past the window; 0 turns it off.
    retention_sweep_s: float = 60.0
    idempotency_ttl_s: int = 86_400
    # Durability across a failover (replication is asynchronous): a send or a commit is
    # acknowledged once this many replicas confirmed it (WAIT), or fails with
    # ReplicaWaitError after replica_wait_ms. 0 = do not wait (see README, "Running on
    # Redis Cluster").
    replica_wait: int = 0
    replica_wait_ms: int = 1000
    cache_size: int = 10_000
    cache_max_bytes: int = 1 << 30  # of warm state (estimated as its log bytes), per worker
    shutdown_grace_s: float = 30.0
    # Connections (see connection.py): a command without an answer within
    # socket_timeout_s fails; a blocking read blocks at most half of it.
    socket_timeout_s: float = 10.0
    max_connections: int = 100  # per pool; a caller waits up to pool_timeout_s for one
    pool_timeout_s: float = 20.0
    # The gateway's event streams, each holding a connection while it waits.
    max_event_streams: int = 64
    max_event_streams_per_identity: int = 16
    # Client tool snapshots (their schemas are untrusted; see actions.check_client_tools).
    max_client_tools: int = 64
    max_schema_bytes: int = 64 * 1024  # one input or output schema, as JSON
    max_schema_depth: int = 32
    # The HTTP server of `wakeful serve` (see http_limits.py): what a request may
    # cost before the gateway routes it.
    max_body_bytes: int = 1024 * 1024
    max_header_bytes: int = 16 * 1024  # request line and headers together
    max_headers: int = 100
    header_timeout_s: float = 10.0  # to send the request line and headers
    keep_alive_s: int = 5  # an idle connection between requests is closed after
    max_http_connections: int = 256

    def __post_init__(self) -> None:
        self._check_numbers()
        if not isinstance(self.prefix, str) or not self.prefix:
            raise ConfigError(f"setting prefix must be a non-empty string, got {self.prefix!r}")
        for name in (
            "partitions",
            "lease_ttl_ms",
            "max_concurrency",
            "read_count",
            "timer_poll_ms",
            "max_event_bytes",
            "max_attempts",
            "snapshot_every",
            "cache_size",
            "cache_max_bytes",
            "max_connections",
            "max_event_streams",
            "max_event_streams_per_identity",
            "max_client_tools",
            "max_schema_bytes",
            "max_schema_depth",
            "max_body_bytes",
            "max_header_bytes",
            "max_headers",
            "max_http_connections",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name} must be at least 1, got {getattr(self, name)}")
        if self.lease_ttl_ms < 300:
            raise ConfigError(f"setting lease_ttl_ms must be at least 300, got {self.lease_ttl_ms}")
        if self.heartbeat_interval_ms and not 100 <= self.heartbeat_interval_ms <= (
            self.lease_ttl_ms // 2
        ):
            raise ConfigError(
                f"setting heartbeat_interval_ms must be between 100 and half of lease_ttl_ms "
                f"({self.lease_ttl_ms // 2}), or 0, got {self.heartbeat_interval_ms}: a lease "
                "must be renewed at least twice before it lapses"
            )

        if self.replica_wait_ms < 1:
            raise ConfigError(
                f"setting replica_wait_ms must be at least 1, got {self.replica_wait_ms}"
            )
        for name in (
            "retention_s",
            "retention_entries",
            "retention_sweep_s",
            "replica_wait",
            "stall_limit_ms",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"setting {name} must not be negative, got {getattr(self, name)}")
        for name in ("socket_timeout_s", "pool_timeout_s", "header_timeout_s", "keep_alive_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"setting {name} must be positive, got {getattr(self, name)}")
        if self.max_event_streams >= self.max_connections - 1:
            raise ConfigError(
                f"setting max_event_streams ({self.max_event_streams}) must be below "
                f"max_connections - 1 ({self.max_connections - 1}): each open event stream "
                "holds a connection while it waits, and the runtime keeps one for its scripts"
            )

    def _check_numbers(self) -> None:
        """NaN and infinity are refused before any bound is checked. NaN compares false
        with every number, so ``nan < 1`` and ``nan <= 0`` let it pass them all
        (``WAKEFUL_SOCKET_TIMEOUT_S=nan`` then made every command say Redis could not be
        reached); infinity passes them and fails later, where a setting becomes
        milliseconds (``int(inf)``: an OverflowError in ``tail -f`` and the worker)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"setting {f.name} must be a finite number, got {value}")

    def __repr__(self) -> str:
        """The fields, with the password of ``redis_url`` redacted: settings get logged."""
        url = None if self.redis_url is None else redact_url(self.redis_url)
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr
        )
        return f"Settings(redis_url={url!r}, {fields})"

    @property
    def heartbeat_ms(self) -> int:
        """The lease keeper's tick: ``heartbeat_interval_ms`` if set, else a third of the
        lease."""
        return self.heartbeat_interval_ms or max(100, self.lease_ttl_ms // 3)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = f"WAKEFUL_{f.name.upper()}"
            if var not in env:
                continue
            raw = env[var]
            kind: type[Any] = str if f.default is None else type(f.default)
            try:
                if kind is not str:
                    values[f.name] = kind(raw)
                else:  # empty is "not set" only where None means that (redis_url)
                    values[f.name] = raw if raw or f.default is not None else None
            except ValueError:
                raise ConfigError(
                    f"environment variable {var}={raw!r} is not a valid {kind.__name__}"
                ) from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
