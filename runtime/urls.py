"""Entity URLs: ``/<type>/<id>``.

Rules (checked by :func:`parse_url` and :func:`entity_url`):

* ``type``: 1-64 characters, lowercase ASCII letters, digits, ``_`` and ``-``,
  starting with a letter. Example: ``assistant``, ``web-researcher``.
* ``id``: 1-200 characters from ``A-Z a-z 0-9 . _ ~ : @ -``, starting with a
  letter or digit. These are all URL-safe, so an entity URL never needs escaping
  in HTTP paths, Redis keys or log lines. ``/``, spaces, braces and other
  characters are rejected.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidTypeNameError, InvalidUrlError

TYPE_MAX = 64
ID_MAX = 200
TYPE_PATTERN = r"[a-z][a-z0-9_-]*"
ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._~:@-]*"
_TYPE_RE = re.compile(TYPE_PATTERN)
_ID_RE = re.compile(ID_PATTERN)
# A whole valid URL at once (the rules above, lengths included): the common case costs
# one match; a URL it refuses goes through the checks that name what is wrong.
_URL_RE = re.compile(
    rf"/([a-z][a-z0-9_-]{{0,{TYPE_MAX - 1}}})/([A-Za-z0-9][A-Za-z0-9._~:@-]{{0,{ID_MAX - 1}}})"
)


class EntityUrl(NamedTuple):
    type: str
    id: str

    def __str__(self) -> str:
        return f"/{self.type}/{self.id}"


def _part_problem(part: object, limit: int) -> str | None:
    """What a type and an id both must be: a non-empty string of at most ``limit``."""
    if not isinstance(part, str):
        return f"must be a string, not {type(part).__name__}"
    if not part:
        return "must not be empty"
    if len(part) > limit:
        return f"is {len(part)} characters long, the limit is {limit}"
    return None


def _type_problem(name: object) -> str | None:
    problem = _part_problem(name, TYPE_MAX)
    if problem is None and not _TYPE_RE.fullmatch(str(name)):
        return "must start with a lowercase letter and use only a-z, 0-9, '_' and '-'"
    return problem


def _id_problem(entity_id: object) -> str | None:
    problem = _part_problem(entity_id, ID_MAX)
    if problem is None and not _ID_RE.fullmatch(text := str(entity_id)):
        bad = sorted({c for c in text if not re.fullmatch(r"[A-Za-z0-9._~:@-]", c)})
        if bad:
            return f"contains characters that are not allowed: {''.join(bad)!r}"
        return "must start with a letter or a digit"
    return problem


def validate_type_name(name: object) -> str:
    """Return ``name`` if it is a valid entity type name, else raise InvalidTypeNameError."""
    problem = _type_problem(name)
    if problem:
        raise InvalidTypeNameError(f"invalid entity type name {name!r}: {problem}")
    assert isinstance(name, str)  # _type_problem refuses anything else
    return name


def entity_url(type_name: str, entity_id: str) -> str:
    """Build ``/<type>/<id>`` after validating both parts."""
    return str(_checked(type_name, entity_id))


def parse_url(url: object) -> EntityUrl:
    """Parse and validate an entity URL, naming the part that is wrong."""
    if not isinstance(url, str):
        raise InvalidUrlError(url, "url", f"must be a string, not {type(url).__name__}")
    valid = _URL_RE.fullmatch(url)
    if valid is not None:
        return EntityUrl(valid[1], valid[2])
    if not url.startswith("/"):
        raise InvalidUrlError(url, "url", "must start with '/' (expected /<type>/<id>)")
    parts = url[1:].split("/")
    if len(parts) != 2:
        raise InvalidUrlError(url, "url", "must have exactly two parts: /<type>/<id>")
    type_name, entity_id = parts
    return _checked(type_name, entity_id)


def _checked(type_name: str, entity_id: str) -> EntityUrl:
    """The two parts of a URL, checked; the error names the one that is wrong."""
    if problem := _type_problem(type_name):
        raise InvalidUrlError(type_name, "type", problem)
    if problem := _id_problem(entity_id):
        raise InvalidUrlError(entity_id, "id", problem)
    return EntityUrl(type_name, entity_id)
