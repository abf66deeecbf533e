"""The bearer tokens of ``wakeful serve``, kept out of the process list.

A command-line argument is visible to every user of the machine (``ps``), so
tokens come preferably from a file (``--token-file PATH``) or the environment
(``WAKEFUL_TOKENS``); ``--token USER=TOKEN`` still works, with a warning. Each
source holds ``USER=TOKEN`` entries: the file one a line (blank lines and lines
starting with ``#`` are skipped), the variable separated by whitespace or commas
(a bearer token has neither). A token given to two users is refused, and no
message ever quotes a token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import ConfigError

TOKENS_VAR = "WAKEFUL_TOKENS"
_SEPARATORS = re.compile(r"[\s,]+")


_HEADER_TEXT = re.compile(r"[\x20-\x7e]+")  # what a client can send in Authorization


def _entry(spec: str, where: str) -> tuple[str, str]:
    user, sep, token = spec.strip().partition("=")
    if not sep or not user.strip() or not token.strip():
        shown = f"{user}=..." if sep else "an entry without '='"
        raise ConfigError(f"{where}: {shown} is not USER=TOKEN")
    if not _HEADER_TEXT.fullmatch(token.strip()):
        # The server reads header bytes as Latin-1: a UTF-8 'é' in the header arrives as
        # 'Ã©' and the token never matches, a 401 with no hint why.
        raise ConfigError(
            f"{where}: the token of {user.strip()!r} has a character an HTTP header cannot "
            "carry (use printable ASCII, e.g. openssl rand -hex 24)"
        )
    return user.strip(), token.strip()


def _from_file(path: str) -> list[tuple[str, tuple[str, str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"--token-file {path!r} cannot be read: {reason}") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            where = f"--token-file {path!r} line {number}"
            entries.append((where, _entry(line, where)))
    return entries


def load_tokens(
    flags: Sequence[str] | None,
    token_file: str | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, dict[str, str]]:
    """Token -> identity (``{"user": USER}``) from ``--token`` flags, ``--token-file``
    and ``$WAKEFUL_TOKENS`` together; empty if none is given (no authentication)."""
    env = os.environ if environ is None else environ
    entries = [("--token", _entry(flag, "--token")) for flag in flags or []]
    if token_file:
        entries += _from_file(token_file)
    for spec in _SEPARATORS.split(env.get(TOKENS_VAR, "").strip()):
        if spec:
            entries.append((TOKENS_VAR, _entry(spec, TOKENS_VAR)))
    tokens: dict[str, dict[str, str]] = {}
    for where, (user, token) in entries:
        owner = tokens.setdefault(token, {"user": user})["user"]
        if owner != user:
            raise ConfigError(f"{where}: the same token is given to {owner!r} and {user!r}")
    return tokens
