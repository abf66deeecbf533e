"""Credentials are never printed: every printer of a Redis URL redacts its password,
and ``serve`` takes its tokens from a file or the environment, out of ``ps``.

The CLI tests run the real command in a subprocess against a private redis-server
whose user ``alice`` has the password :data:`PASSWORD`, and look for it in all that
the command printed (stdout, stderr, its log lines)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis as sync_redis

from tests.apps.harness import PrivateRedis, free_port, until
from tests.terminals import interrupted_on_a_terminal
from wakeful import Runtime, Settings
from wakeful.cli_tokens import load_tokens
from wakeful.connection import connect
from wakeful.entities import registry
from wakeful.errors import ConfigError
from wakeful.redaction import RedactingFormatter, redact, redact_url, url_secrets

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "Pw-0f-alice-x7"
TOKEN = "tok-of-bob-9q"


# -- the redaction itself ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{PASSWORD}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        (f"redis://alice:{PASSWORD}@host/0", "redis://alice:***@host/0"),
        (f"rediss://alice:{PASSWORD}@host:1", "rediss://alice:***@host:1"),
        (f"redis://{PASSWORD}@host", "redis://***@host"),  # no ':': may be a password
        (f"redis://a:{PASSWORD}@with@at@host", "redis://a:***@host"),  # an unescaped @
        (f"redis://a:{PASSWORD}/x@host", "redis://a:***@host"),  # an unescaped /
        (f"redis://host/0?password={PASSWORD}&db=1", "redis://host/0?password=***&db=1"),
        (f"unix:///tmp/r.sock?db=0&password={PASSWORD}", "unix:///tmp/r.sock?db=0&password=***"),
        (f"redis://alice:{PASSWORD}", "redis://alice:***"),  # the host forgotten
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://[::1]:6379", "redis://[::1]:6379"),
        ("redis://alice:@host", "redis://alice:@host"),  # an empty password
    ],
)
def test_redact_url_hides_every_password(url, shown):
    assert redact_url(url) == shown
    assert PASSWORD not in redact(f"at {url}: failed")


def test_redact_replaces_the_secrets_it_is_given_too():
    url = f"redis://alice:{PASSWORD.replace('-', '%2D')}@host"
    secrets = url_secrets(url)
    assert PASSWORD in secrets  # percent-decoded as well as written
    assert redact(f"bad port {PASSWORD!r}", secrets) == "bad port '***'"


def test_settings_print_without_the_password():
    settings = Settings(redis_url=f"redis://alice:{PASSWORD}@host/0")
    assert PASSWORD not in repr(settings)
    assert "redis_url='redis://alice:***@host/0'" in repr(settings)
    assert "prefix='wk'" in repr(settings)


@pytest.mark.parametrize(
    "url",
    [f"redis://alice:{PASSWORD}", f"redis://:{PASSWORD}@host:port/0", f"redis://:{PASSWORD}@[::1"],
)
def test_a_malformed_url_is_a_config_error_that_does_not_quote_the_password(url):
    with pytest.raises(ConfigError) as info:
        connect(url)
    assert "is malformed" in str(info.value)
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@127.0.0.1:6379/0?decode_responses=true",
        f"redis+cluster://:{PASSWORD}@127.0.0.1:7000?decode_responses=1",
    ],
)
def test_a_url_asking_for_decoded_replies_is_refused_naming_the_option(url):
    """The URL's options override the client's: every command was a UnicodeDecodeError."""
    with pytest.raises(ConfigError, match="leave decode_responses out of the URL") as info:
        connect(url)
    assert PASSWORD not in str(info.value)


def test_log_lines_are_redacted():
    formatter = RedactingFormatter("%(message)s", url_secrets(f"redis://:{PASSWORD}@h"))
    try:
        raise ConnectionError(f"lost redis://:{PASSWORD}@h while reading {PASSWORD}")
    except ConnectionError:
        record = logging.LogRecord(
            "t", logging.ERROR, __file__, 1, "at %s", (f"redis://:{PASSWORD}@h",), sys.exc_info()
        )
    line = formatter.format(record)
    assert "ConnectionError" in line and "redis://:***@h" in line
    assert PASSWORD not in line


def test_the_cli_log_handler_redacts_every_line(capsys):
    from wakeful.cli import _log_redacted

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        _log_redacted(logging.INFO, url_secrets(f"redis://:{PASSWORD}@h"))
        logging.getLogger("wakeful.test").info("lost %s (%s)", f"redis://:{PASSWORD}@h", PASSWORD)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "lost redis://:***@h (***)" in err
    assert PASSWORD not in err


def test_the_http_servers_log_lines_are_redacted_too(capsys):
    """uvicorn's own loggers (an ASGI traceback, say) go through the same handler: with
    uvicorn's logging configuration they had handlers of their own, unredacted, and a
    server configured before in the process (uvicorn's default) leaves them behind."""
    import uvicorn

    from wakeful.cli import _log_redacted
    from wakeful.http_limits import server_config

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        _log_redacted(logging.INFO, url_secrets(f"redis://:{PASSWORD}@h"))
        uvicorn.Config(object(), log_level="warning")  # uvicorn's own logging configuration
        server_config(object(), host="127.0.0.1", port=1, settings=Settings())
        logging.getLogger("uvicorn.error").error("lost redis://:%s@h", PASSWORD)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "uvicorn.error: lost redis://:***@h" in err
    assert PASSWORD not in err


# -- tokens --------------------------------------------------------------------------


def test_tokens_come_from_a_file_and_the_environment(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"# who may call the gateway\nalice=a-token\n\n bob = {TOKEN}\n")
    tokens = load_tokens(None, str(path), {"WAKEFUL_TOKENS": "carol=c1, dave=d1\nerin=e1"})
    assert tokens == {
        "a-token": {"user": "alice"},
        TOKEN: {"user": "bob"},
        "c1": {"user": "carol"},
        "d1": {"user": "dave"},
        "e1": {"user": "erin"},
    }
    assert load_tokens(["zed=z1"], None, {}) == {"z1": {"user": "zed"}}
    assert load_tokens(None, None, {}) == {}


@pytest.mark.parametrize(
    ("flags", "text", "env", "message"),
    [
        (None, f"bob {TOKEN}\n", "", "line 1: an entry without '=' is not USER=TOKEN"),
        (None, "", f"bob={TOKEN} ={TOKEN}", "WAKEFUL_TOKENS: =... is not USER=TOKEN"),
        ([f"bob={TOKEN}"], f"eve={TOKEN}\n", "", "the same token is given to 'bob' and 'eve'"),
        # A client cannot send it: the header's bytes are read as Latin-1 (a 401, forever).
        (None, f"bob={TOKEN}é\n", "", "line 1: the token of 'bob' has a character an HTTP"),
        ([f"bob={TOKEN}\x00"], "", "", "--token: the token of 'bob' has a character an HTTP"),
    ],
)
def test_bad_token_entries_are_named_without_the_token(tmp_path, flags, text, env, message):
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_tokens(flags, str(path), {"WAKEFUL_TOKENS": env})
    assert message in str(info.value)
    assert TOKEN not in str(info.value)


def test_an_unreadable_token_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--token-file '.*missing' cannot be read"):
        load_tokens(None, str(tmp_path / "missing"), {})


# -- the command line ---------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own, with the user ``alice`` (password PASSWORD)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    admin = sync_redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "alice", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    admin.close()
    try:
        yield server
    finally:
        server.stop()


def alice_url(server: PrivateRedis) -> str:
    return f"redis://alice:{PASSWORD}@127.0.0.1:{server.port}/0"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wakeful.cli", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text, text
        assert TOKEN not in text, text


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        (
            f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0",
            6,
            "cannot reach Redis at redis://:***@",
        ),
        (f"redis://alice:{PASSWORD}", 1, "Redis URL redis://alice:*** is malformed"),
        (f"redis://:{PASSWORD}@127.0.0.1:port/0", 1, "is malformed: Port could not be cast"),
        (f"http://:{PASSWORD}@127.0.0.1/0", 1, "'http://:***@127.0.0.1/0' must start with"),
    ],
)
def test_cli_errors_do_not_print_the_password(url, code, says):
    out = cli("ls", "--redis", url)
    assert out.returncode == code, out.stderr
    assert says in out.stderr
    assert "warning: --redis shows the Redis password" in out.stderr
    assert_no_secret(out.stdout, out.stderr)


def test_a_wrong_password_is_reported_without_it(private_redis):
    url = f"redis://alice:{PASSWORD}x@127.0.0.1:{private_redis.port}/0"
    out = cli("-v", "ls", env={"WAKEFUL_REDIS_URL": url})
    assert out.returncode == 1, out.stderr  # refused credentials: reachable, not exit 6
    assert "Redis refused the credentials" in out.stderr
    assert "invalid username-password pair" in out.stderr
    assert "--redis shows" not in out.stderr  # it came from the environment
    assert_no_secret(out.stdout, out.stderr)


async def test_the_worker_spinner_and_banner_hide_the_password(private_redis):
    env = {**os.environ, "TERM": "xterm", "WAKEFUL_PARTITIONS": "4"}
    command = [sys.executable, "-m", "wakeful.cli", "-v", "worker", "tests.apps.quiet:registry"]
    output = await asyncio.to_thread(
        interrupted_on_a_terminal, [*command, "--redis", alice_url(private_redis)], env, "running"
    )
    assert "starting a worker on redis://alice:***@127.0.0.1" in output
    assert_no_secret(output)


async def test_the_tail_resume_hint_hides_the_password(private_redis):
    url = alice_url(private_redis)
    rt = Runtime(registry, settings=Settings(redis_url=url, partitions=4), run_worker=False)
    await rt.start()
    try:
        event_id = await rt.send("/notes/n1", "add milk")
    finally:
        await rt.close()
    env = {**os.environ, "TERM": "xterm", "WAKEFUL_PARTITIONS": "4"}
    command = [sys.executable, "-m", "wakeful.cli", "tail", "/notes/n1", "-f", "--redis", url]
    output = await asyncio.to_thread(interrupted_on_a_terminal, command, env, "add milk")
    assert f"--after {event_id}" in output
    assert "resume with: wakeful tail /notes/n1 -f --redis" in output
    assert_no_secret(output)


async def test_tail_follow_stops_when_the_password_stops_working(private_redis):
    """``tail -f`` rides out a lost connection, but refused credentials (the user's
    password changed under it) are no outage: it exits 1 naming them, instead of
    "connection lost; resuming" once a second forever."""
    url = alice_url(private_redis)
    rt = Runtime(registry, settings=Settings(redis_url=url, partitions=4), run_worker=False)
    await rt.start()
    try:
        await rt.send("/notes/n2", "add milk")
    finally:
        await rt.close()
    command = [sys.executable, "-m", "wakeful.cli", "tail", "/notes/n2", "-f", "--redis", url]
    env = {**os.environ, "WAKEFUL_PARTITIONS": "4"}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # following: the entry is printed
            if "add milk" in line:
                break
        admin = sync_redis.Redis(port=private_redis.port)
        admin.execute_command("ACL", "SETUSER", "alice", "resetpass", ">another-pw")
        admin.execute_command("CLIENT", "KILL", "USER", "alice")
        admin.close()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert "Redis refused the credentials" in stderr
    assert stderr.count("resuming after") <= 1, stderr  # the kill itself: a lost connection
    assert_no_secret(stderr)


async def test_serve_takes_tokens_from_a_file_and_hides_the_password(private_redis, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"bob={TOKEN}\n")
    port = free_port()
    command = [sys.executable, "-m", "wakeful.cli", "-v", "serve", "wakeful.entities:registry"]
    command += ["--port", str(port), "--token-file", str(tokens)]
    env = {**os.environ, "WAKEFUL_REDIS_URL": alice_url(private_redis), "WAKEFUL_PARTITIONS": "4"}
    env["WAKEFUL_TOKENS"] = "carol=c-token"
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        base = f"http://127.0.0.1:{port}"

        async def answers() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.communicate()}")
            with contextlib.suppress(httpx.TransportError):
                async with httpx.AsyncClient() as http:
                    return (await http.get(base + "/openapi.json")).status_code == 200
            return False

        await until(answers, 30, "serve to answer")
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/manifest")).status_code == 401
            for token in (TOKEN, "c-token"):
                headers = {"authorization": f"Bearer {token}"}
                assert (await http.get("/manifest", headers=headers)).status_code == 200
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        assert_no_secret(cmdline)  # what ps shows
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    assert "no worker runs on redis://alice:***@127.0.0.1" in stdout
    assert_no_secret(stdout, stderr)


def test_a_token_on_the_command_line_is_warned_about():
    # A bad entry ends serve before it listens.
    out = cli("serve", "wakeful.entities:registry", "--port", str(free_port()), "--token", "bob")
    assert out.returncode == 1
    assert "warning: --token shows the token to every user of this machine (ps)" in out.stderr
    assert "--token: an entry without '=' is not USER=TOKEN" in out.stderr
