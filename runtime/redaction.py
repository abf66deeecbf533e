"""Credentials never printed: the one redaction every printer and logger uses.

A Redis URL carries its password (``redis://user:PASSWORD@host``, or
``?password=`` in its query), and whoever reads a terminal, a log file or a
screenshot must not learn it. Everything that prints a URL or a text that may
hold one (an error, a banner, a spinner, a log line, a resume hint) passes it
through :func:`redact_url` or :func:`redact` first; :class:`RedactingFormatter`
does it for log records.

The rules, conservative by design (a redacted host is better than a printed
password):

* everything between ``://`` and the last ``@`` of a URL is its user info:
  ``user:secret`` keeps ``user`` and becomes ``user:***``; user info without a
  ``:`` may be a password on its own (``redis://secret@host``) and becomes ``***``;
* without an ``@``, a "port" that is not a number is a password that lost its
  host (``redis://user:secret``) and becomes ``***``;
* a query parameter whose name says it is a secret (``password``,
  ``ssl_password``, ``token``, ...) keeps its name and loses its value;
* :func:`redact` also replaces every literal secret it is given (a password that
  a parser quoted back in its own message, a bearer token).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote

REDACTED = "***"

# A URL inside free text: scheme://, then up to whitespace or a quote, without the
# punctuation that ends a phrase ("at redis://h:1: refused").
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,;:)\]]")
_SECRET_PARAM = re.compile(r"pass|secret|token|auth|key", re.I)


def _split(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, user info, rest after the last @)``, or None if there is no user info."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    at = url.rfind("@", start)
    if at < 0:
        return None
    return url[:start], url[start:at], url[at + 1 :]


def _hostless_password(url: str) -> tuple[int, int] | None:
    """Where the "port" of a URL without user info is not a number: the span of what is
    then a password without its host (``redis://user:secret``)."""
    scheme_end = url.find("://")
    if scheme_end < 0 or "@" in url:
        return None
    start = scheme_end + 3
    netloc = re.match(r"[^/?#]*", url[start:])
    assert netloc is not None  # the pattern matches the empty string too
    host, colon, port = netloc.group(0).rpartition(":")
    if not colon or not port or port.isdigit() or "]" in port:  # "]": an IPv6 address
        return None
    return start + len(host) + 1, start + len(netloc.group(0))


def _redact_query(rest: str) -> str:
    path, sep, query = rest.partition("?")
    if not sep:
        return rest
    params = []
    for param in query.split("&"):
        name, eq, value = param.partition("=")
        params.append(
            f"{name}={REDACTED}" if eq and value and _SECRET_PARAM.search(name) else param
        )
    return f"{path}?{'&'.join(params)}"


def redact_url(url: str) -> str:
    """``url`` with its password (in the user info or the query) replaced by ``***``."""
    parts = _split(url)
    if parts is None:
        if span := _hostless_password(url):
            url = url[: span[0]] + REDACTED + url[span[1] :]
        return _redact_query(url)
    scheme, userinfo, rest = parts
    user, colon, password = userinfo.partition(":")
    if not colon:
        shown = REDACTED if userinfo else ""
    else:
        shown = f"{user}:{REDACTED}" if password else userinfo
    return f"{scheme}{shown}@{_redact_query(rest)}"


def url_secrets(url: str) -> list[str]:
    """The secrets ``url`` carries, as written and percent-decoded: its password and
    its secret query values. For :func:`redact`'s ``secrets``."""
    found: list[str] = []
    parts = _split(url)
    rest = url
    if parts is not None:
        _, userinfo, rest = parts
        found.append(userinfo.partition(":")[2])
    elif span := _hostless_password(url):
        found.append(url[span[0] : span[1]])
    for param in rest.partition("?")[2].split("&"):
        name, eq, value = param.partition("=")
        if eq and _SECRET_PARAM.search(name):
            found.append(value)
    secrets = [s for s in found if s]
    return sorted({*secrets, *(unquote(s) for s in secrets)}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`) and every one of
    ``secrets`` (longest first) replaced by ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


class RedactingFormatter(logging.Formatter):
    """A log formatter whose every line (message, exception and stack) is redacted."""

    def __init__(self, fmt: str | None = None, secrets: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        self.secrets = list(secrets)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self.secrets)
