"""The gateway's limits hold before the damage, and it answers only to its own Host
names (issue 13): each attack sent over raw sockets to a real uvicorn server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from tests.apps.harness import serving_embedded
from wakeful import HandlerContext, Registry, Runtime, Settings
from wakeful.gateway import create_app
from wakeful.http_limits import allowed_hosts, host_name, server_config

WAIT_S = 30.0  # the longest any socket read waits: a hung server fails, a slow one passes


def registry() -> Registry:
    reg = Registry()

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(f"echo {m.payload}")

    return reg


@contextlib.contextmanager
def served(**limits: Any) -> Iterator[int]:
    """The gateway on the embedded default, served as ``wakeful serve`` serves it, in a
    thread. The socket listens before the server starts, so clients may connect at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    servers: list[uvicorn.Server] = []
    started = threading.Event()

    async def main() -> None:
        async with Runtime(registry(), settings=Settings(**limits)) as rt:
            app = create_app(rt, allowed_hosts=allowed_hosts("127.0.0.1"))
            server = uvicorn.Server(
                server_config(app, host="127.0.0.1", port=port, settings=rt.settings)
            )
            servers.append(server)
            started.set()
            await server.serve(sockets=[sock])

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    try:
        assert started.wait(WAIT_S)
        yield port
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(WAIT_S)
        sock.close()


def connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    return conn


def response(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response (its body by Content-Length); status 0 if the server closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers.get("content-length", "0")):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed(conn: socket.socket) -> bool:
    """True once the server has closed the connection (reads to its end)."""
    try:
        while conn.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def error_of(body: bytes) -> dict[str, str]:
    return json.loads(body)["error"]


def request(path: str, *headers: str, method: str = "GET", host: str = "127.0.0.1") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *headers, "", ""]
    return "\r\n".join(lines).encode()


# -- 7. limits before the damage ------------------------------------------------------


def test_a_body_declared_over_the_limit_is_refused_before_it_is_read():
    with served(max_body_bytes=4096) as port, connect(port) as conn:
        conn.sendall(
            request(
                "/entities/echo/e/messages",
                "Content-Type: application/json",
                "Content-Length: 300000000",
                method="POST",
            )
            + b'{"payload": "'
            + b"x" * 1000
        )
        status, headers, body = response(conn)
        assert status == 413 and headers["connection"] == "close"
        assert error_of(body)["type"] == "BodyTooLarge"
        assert "300000000" in error_of(body)["message"]
        assert closed(conn)


def test_a_streamed_body_is_cut_at_the_limit():
    with served(max_body_bytes=4096) as port, connect(port) as conn:
        conn.sendall(
            request(
                "/entities/echo/e/messages",
                "Content-Type: application/json",
                "Transfer-Encoding: chunked",
                method="POST",
            )
        )
        chunk = b"x" * 1024
        with contextlib.suppress(OSError):  # the server may close while we still send
            for _ in range(8):  # twice the limit, and never the last chunk
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, body = response(conn)
        assert status == 413 and error_of(body)["type"] == "BodyTooLarge"
    # The runtime wrote nothing: the entity does not exist.


def test_headers_over_the_size_limit_are_refused_without_reading_them_all():
    with served(max_header_bytes=8192) as port, connect(port) as conn:
        conn.sendall(b"GET /manifest HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        with contextlib.suppress(OSError):
            for _ in range(64):  # 4 MB, never ending the header
                conn.sendall(b"a" * 65536)
        status, _, body = response(conn)
        assert status == 431 and error_of(body)["type"] == "HeadersTooLarge"
        assert closed(conn)


def test_too_many_headers_are_refused():
    many = [f"X-H{i}: {i}" for i in range(30)]
    with served(max_headers=20) as port:
        with connect(port) as conn:
            conn.sendall(request("/manifest", *many))
            status, _, body = response(conn)
            assert status == 431 and error_of(body)["type"] == "TooManyHeaders"
        with connect(port) as conn:  # within the limit: served
            conn.sendall(request("/manifest", *many[:10]))
            assert response(conn)[0] == 200


def test_slow_headers_time_out():
    with served(header_timeout_s=1.0) as port:
        with connect(port) as conn:  # says nothing at all
            status, _, body = response(conn)
            assert status == 408 and error_of(body)["type"] == "RequestTimeout"
            assert closed(conn)
        with connect(port) as conn:  # a request line, then nothing
            conn.sendall(b"GET /manifest HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
            status, _, _ = response(conn)
            assert status == 408 and closed(conn)
        with connect(port) as conn:  # a kept-alive connection is timed on its next request
            conn.sendall(request("/manifest"))
            assert response(conn)[0] == 200
            conn.sendall(b"GET /manifest HT")
            assert response(conn)[0] == 408


def test_connections_over_the_cap_are_refused_and_a_freed_one_is_reused():
    with served(max_http_connections=4, header_timeout_s=60, keep_alive_s=60) as port:
        held = [connect(port) for _ in range(4)]
        try:
            for conn in held:  # each served, and kept open
                conn.sendall(request("/manifest"))
                assert response(conn)[0] == 200
            with connect(port) as extra:
                status, headers, body = response(extra)
                assert status == 503 and headers["retry-after"]
                assert error_of(body)["type"] == "TooManyConnections"
                assert closed(extra)
            held.pop().close()
            for _ in range(100):  # until the server has seen the close
                with connect(port) as again:
                    again.sendall(request("/manifest"))
                    if response(again)[0] == 200:
                        break
            else:
                pytest.fail("a freed connection was never reused")
        finally:
            for conn in held:
                conn.close()


# -- 8. DNS rebinding -----------------------------------------------------------------


def test_a_request_for_another_host_is_refused_before_anything_is_written():
    with served() as port:
        for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}"):
            with connect(port) as conn:
                conn.sendall(
                    request(
                        "/entities/echo/e",
                        "Content-Type: application/json",
                        "Content-Length: 2",
                        method="POST",
                        host=host,
                    )
                    + b"{}"
                )
                status, headers, body = response(conn)
                assert status == 421 and headers["content-type"] == "application/json"
                assert error_of(body)["type"] == "MisdirectedRequest"
                assert host in error_of(body)["message"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            with connect(port) as conn:
                conn.sendall(request("/entities/echo/e", host=host))
                assert response(conn)[0] == 404  # answered: the entity was never created


def test_the_default_host_names_follow_the_bound_address():
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "::1", "localhost"]
    assert allowed_hosts("127.0.0.1", ["gw.example"]) == [
        "127.0.0.1",
        "::1",
        "gw.example",
        "localhost",
    ]
    assert allowed_hosts("192.0.2.7") == ["192.0.2.7"]
    assert allowed_hosts("0.0.0.0") is None  # every address: every name, unless told
    assert allowed_hosts("0.0.0.0", ["gw.example"]) == [
        "127.0.0.1",
        "::1",
        "gw.example",
        "localhost",
    ]
    assert allowed_hosts("127.0.0.1", ["*"]) is None
    assert [host_name(h) for h in ("LocalHost:80", "[::1]:8000", "::1", "a.b")] == [
        "localhost",
        "::1",
        "::1",
        "a.b",
    ]


def test_serve_checks_host_and_takes_its_limits_from_flags():
    flags = ("--allowed-host", "gw.example", "--max-header-bytes", "4096")
    with serving_embedded(*flags) as (proc, base):
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # printed once the runtime has started
        assert banner.startswith("serving"), banner
        manifest = httpx.get(f"{base}/manifest", timeout=WAIT_S)
        assert manifest.status_code == 200
        named = httpx.get(f"{base}/manifest", headers={"host": "gw.example"}, timeout=WAIT_S)
        assert named.status_code == 200
        foreign = httpx.get(f"{base}/manifest", headers={"host": "evil.example"}, timeout=WAIT_S)
        assert foreign.status_code == 421
        big = httpx.get(f"{base}/manifest", headers={"x-big": "a" * 8000}, timeout=WAIT_S)
        assert big.status_code == 431
