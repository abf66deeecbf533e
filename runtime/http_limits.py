"""What a request may cost before the gateway routes it, and whom it may come from.

``wakeful serve`` runs the gateway on uvicorn with its httptools parser, which
bounds neither the size of a request's headers nor the time a client takes to
send them, and counts connections only to answer 503 once a request is in.
:func:`server_config` therefore runs uvicorn with :class:`GuardedHttpTools`, a
protocol that, for each connection:

* refuses it at once (503, closed) when ``max_http_connections`` are open;
* refuses a request whose request line and headers pass ``max_header_bytes``,
  or that has more than ``max_headers`` headers (431), before parsing on: a
  100 MB header is never buffered;
* closes it (408) when its request line and headers have not arrived within
  ``header_timeout_s`` of the connection (or of the previous response), so
  partial requests cannot hold connections open;
* and closes an idle keep-alive connection after ``keep_alive_s``
  (uvicorn's ``timeout_keep_alive``).

Refusals are JSON like the rest of the API and close the connection. Bodies are
limited by the gateway itself (``http_input.read_body``: ``Content-Length``
first, then as the body streams in), and uvicorn's flow control stops reading a
body nobody reads.

:class:`HostAllowList` refuses a request whose ``Host`` is not allowed (421),
so a web page cannot reach a gateway on this machine by DNS rebinding (its
requests carry the attacker's host name): :func:`allowed_hosts` gives the
default for an address the server binds to.
"""

from __future__ import annotations

import asyncio
import http
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .config import Settings

RETRY_AFTER_S = 5  # what a refused connection is told to wait


@dataclass(frozen=True)
class ServerLimits:
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> ServerLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            header_timeout_s=settings.header_timeout_s,
            max_connections=settings.max_http_connections,
        )


def server_config(app: Any, *, host: str, port: int, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration of ``wakeful serve``: ``app`` behind the limits of
    ``settings``."""
    logged_through_root()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        log_config=None,  # keep the loggers as logged_through_root left them
        http=guarded_protocol(ServerLimits.of(settings)),
        timeout_keep_alive=settings.keep_alive_s,
    )


UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def logged_through_root() -> None:
    """Make uvicorn's loggers log through the root logger, whose handler (the CLI's)
    redacts every line; a server's ``log_config=None`` then keeps them so.

    uvicorn's own logging configuration gives its loggers handlers of their own that
    do not propagate, so a secret in an ASGI traceback was printed as is; a server
    configured before in the same process leaves those handlers behind."""
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def guarded_protocol(limits: ServerLimits) -> type[GuardedHttpTools]:
    """A protocol class bound to ``limits`` (uvicorn builds one per connection)."""
    return type("GuardedHttpTools", (GuardedHttpTools,), {"limits": limits})


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`ServerLimits`."""

    limits: ClassVar[ServerLimits]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_bytes = 0  # of the request line and headers being read
        self._head_count = 0
        self._in_head = True
        self._refusal: tuple[int, str, str] | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                "TooManyConnections",
                f"the server has {self.limits.max_connections} connections open; retry later",
            )
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self.transport.is_closing():
            return
        if self._in_head:
            room = self.limits.max_header_bytes - self._head_bytes
            if len(data) > room:  # feed what fits; the rest only if the headers ended
                head, rest = data[: max(room, 0)], data[max(room, 0) :]
                self._head_bytes += len(head)
                if head:
                    self._feed(head)
                if self._in_head and self._refusal is None:
                    self._refusal = (
                        431,
                        "HeadersTooLarge",
                        f"the request line and headers are over "
                        f"{self.limits.max_header_bytes} bytes",
                    )
                if self._refusal is None:
                    self.data_received(rest)
                else:
                    self._refuse(*self._refusal)
                return
            self._head_bytes += len(data)
        self._feed(data)
        if self._refusal is not None:
            self._refuse(*self._refusal)

    def _feed(self, data: bytes) -> None:
        super().data_received(data)

    # -- parser callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        self._head_count = 0
        self._in_head = True
        if self._head_timer is None:  # the next request on a kept-alive connection
            self._arm_head_timer()
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._refusal is None:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.limits.max_headers:
            self._refusal = self._refusal or (
                431,
                "TooManyHeaders",
                f"the request has more than {self.limits.max_headers} headers",
            )
        if self._refusal is None:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        if self._refusal is None:  # otherwise the app never sees the request
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refusal is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refusal is None:
            super().on_message_complete()

    # -- refusals ----------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head and self._refusal is None and not self.transport.is_closing():
            self._refuse(
                408,
                "RequestTimeout",
                f"the request line and headers did not arrive within "
                f"{self.limits.header_timeout_s:g} s",
            )

    def _refuse(self, status: int, kind: str, message: str) -> None:
        """Answer ``status`` with a JSON error and close the connection."""
        self._refusal = (status, kind, message)
        self._disarm_head_timer()
        if self.transport.is_closing():
            return
        body = error_body(kind, message)
        retry = f"retry-after: {RETRY_AFTER_S}\r\n" if status == 503 else ""
        head = (
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{retry}connection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


def error_body(kind: str, message: str) -> bytes:
    return msgspec.json.encode({"error": {"type": kind, "message": message}})


# -- the Host allow-list --------------------------------------------------------------

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> list[str] | None:
    """The ``Host`` names a server bound to ``bind_host`` answers to by default.

    Bound to loopback: the loopback names. Bound to one other address: that
    address. Bound to every address (``0.0.0.0``, ``::``) and no ``extra``:
    ``None``, every name (the banner says so). ``extra`` (``--allowed-host``) is
    added; ``*`` in it allows every name.
    """
    added = [h.strip().lower() for h in extra if h.strip()]
    if "*" in added:
        return None
    if _is_loopback(bind_host):
        return sorted({*LOOPBACK_NAMES, bind_host.lower(), *added})
    if bind_host in ("0.0.0.0", "::", ""):
        return sorted({*LOOPBACK_NAMES, *added}) if added else None
    return sorted({bind_host.lower(), *added})


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """``Host`` without its port, lower-case (``[::1]:8000`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") > 1:  # a bare IPv6 address (no port can follow it)
        return header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


class HostAllowList:
    """ASGI middleware: a request whose ``Host`` is not in ``hosts`` gets 421."""

    def __init__(self, app: Any, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(h.lower().strip("[]") for h in hosts)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == b"host"]
        header = values[0].decode("latin-1") if len(values) == 1 else ""
        if host_name(header) in self.hosts:
            await self.app(scope, receive, send)
            return
        shown = header if len(values) == 1 else f"{len(values)} Host headers"
        body = error_body(
            "MisdirectedRequest",
            f"this gateway does not answer to Host {shown!r} (it answers to "
            f"{', '.join(sorted(self.hosts))}; add a name with --allowed-host)",
        )
        await send(
            {
                "type": "http.response.start",
                "status": 421,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
