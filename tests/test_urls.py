"""Entity URLs: parse_url, entity_url and validate_type_name."""

from __future__ import annotations

import pytest

from wakeful import EntityUrl, InvalidTypeNameError, InvalidUrlError, entity_url, parse_url
from wakeful.errors import WakefulError
from wakeful.urls import ID_MAX, TYPE_MAX, validate_type_name

VALID_TYPES = ["a", "assistant", "web-researcher", "agent_2", "x" * TYPE_MAX, "a-_9"]
VALID_IDS = ["1", "alice", "Alice.Smith", "a~b:c@d-e_f.g", "0" * ID_MAX, "9lives", "A"]


@pytest.mark.parametrize("type_name", VALID_TYPES)
@pytest.mark.parametrize("entity_id", VALID_IDS)
def test_valid_urls_roundtrip(type_name: str, entity_id: str) -> None:
    url = entity_url(type_name, entity_id)
    assert url == f"/{type_name}/{entity_id}"
    parsed = parse_url(url)
    assert parsed == EntityUrl(type_name, entity_id)
    assert parsed.type == type_name
    assert parsed.id == entity_id
    assert str(parsed) == url


@pytest.mark.parametrize("type_name", VALID_TYPES)
def test_validate_type_name_accepts_valid_names(type_name: str) -> None:
    assert validate_type_name(type_name) == type_name


def _url_error(url: object) -> InvalidUrlError:
    with pytest.raises(InvalidUrlError) as info:
        parse_url(url)
    err = info.value
    # Every URL error is a WakefulError and a ValueError, and its message names the part.
    assert isinstance(err, WakefulError)
    assert isinstance(err, ValueError)
    assert err.part in str(err)
    assert err.reason in str(err)
    return err


@pytest.mark.parametrize(
    ("url", "part", "reason_fragment", "value"),
    [
        # whole-url problems
        ("assistant/alice", "url", "must start with '/'", "assistant/alice"),
        ("", "url", "must start with '/'", ""),
        ("/assistant", "url", "exactly two parts", "/assistant"),
        ("/assistant/alice/extra", "url", "exactly two parts", "/assistant/alice/extra"),
        ("/assistant/alice/", "url", "exactly two parts", "/assistant/alice/"),
        ("//assistant/alice", "url", "exactly two parts", "//assistant/alice"),
        # type problems
        ("//alice", "type", "must not be empty", ""),
        ("/Assistant/alice", "type", "lowercase", "Assistant"),
        ("/1assistant/alice", "type", "lowercase", "1assistant"),
        ("/-assistant/alice", "type", "lowercase", "-assistant"),
        ("/assi stant/alice", "type", "lowercase", "assi stant"),
        ("/assi.stant/alice", "type", "lowercase", "assi.stant"),
        (
            f"/{'a' * (TYPE_MAX + 1)}/alice",
            "type",
            f"the limit is {TYPE_MAX}",
            "a" * (TYPE_MAX + 1),
        ),
        # id problems
        ("/assistant/", "id", "must not be empty", ""),
        ("/assistant/al ice", "id", "not allowed: ' '", "al ice"),
        ("/assistant/al{ice}", "id", "not allowed: '{}'", "al{ice}"),
        ("/assistant/al?ice#x", "id", "not allowed: '#?'", "al?ice#x"),
        ("/assistant/ålice", "id", "not allowed: 'å'", "ålice"),
        ("/assistant/.hidden", "id", "must start with a letter or a digit", ".hidden"),
        ("/assistant/-x", "id", "must start with a letter or a digit", "-x"),
        (f"/assistant/{'i' * (ID_MAX + 1)}", "id", f"the limit is {ID_MAX}", "i" * (ID_MAX + 1)),
    ],
)
def test_parse_url_names_the_bad_part(
    url: str, part: str, reason_fragment: str, value: str
) -> None:
    err = _url_error(url)
    assert err.part == part
    assert reason_fragment in err.reason
    assert err.value == value


def test_length_limits_are_inclusive() -> None:
    assert parse_url(f"/{'t' * TYPE_MAX}/{'i' * ID_MAX}") == ("t" * TYPE_MAX, "i" * ID_MAX)
    err = _url_error(f"/{'t' * TYPE_MAX}/{'i' * (ID_MAX + 1)}")
    assert (err.part, err.reason) == (
        "id",
        f"is {ID_MAX + 1} characters long, the limit is {ID_MAX}",
    )
    err = _url_error(f"/{'t' * (TYPE_MAX + 1)}/{'i' * ID_MAX}")
    assert (err.part, err.reason) == (
        "type",
        f"is {TYPE_MAX + 1} characters long, the limit is {TYPE_MAX}",
    )


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(None, "NoneType"), (42, "int"), (b"/a/b", "bytes"), (["/a/b"], "list")],
)
def test_parse_url_rejects_non_strings(value: object, type_name: str) -> None:
    err = _url_error(value)
    assert err.part == "url"
    assert err.reason == f"must be a string, not {type_name}"


def test_the_type_is_checked_before_the_id() -> None:
    err = _url_error("/Bad/also bad")
    assert err.part == "type"


@pytest.mark.parametrize(
    ("type_name", "entity_id", "part", "reason_fragment"),
    [
        ("", "alice", "type", "must not be empty"),
        ("Assistant", "alice", "type", "lowercase"),
        ("a" * (TYPE_MAX + 1), "alice", "type", "the limit is"),
        (None, "alice", "type", "must be a string, not NoneType"),
        ("assistant", "", "id", "must not be empty"),
        ("assistant", "a/b", "id", "not allowed: '/'"),
        ("assistant", "i" * (ID_MAX + 1), "id", "the limit is"),
        ("assistant", 7, "id", "must be a string, not int"),
        ("assistant", "_x", "id", "must start with a letter or a digit"),
    ],
)
def test_entity_url_names_the_bad_part(
    type_name: object, entity_id: object, part: str, reason_fragment: str
) -> None:
    with pytest.raises(InvalidUrlError) as info:
        entity_url(type_name, entity_id)  # type: ignore[arg-type]
    assert info.value.part == part
    assert reason_fragment in info.value.reason
    assert info.value.value == (type_name if part == "type" else entity_id)


@pytest.mark.parametrize(
    ("name", "reason_fragment"),
    [
        ("", "must not be empty"),
        ("Assistant", "lowercase"),
        ("9lives", "lowercase"),
        ("has space", "lowercase"),
        ("has/slash", "lowercase"),
        ("a" * (TYPE_MAX + 1), f"the limit is {TYPE_MAX}"),
        (None, "must be a string"),
        (3, "must be a string"),
    ],
)
def test_validate_type_name_rejects(name: object, reason_fragment: str) -> None:
    with pytest.raises(InvalidTypeNameError) as info:
        validate_type_name(name)
    assert reason_fragment in str(info.value)
    assert repr(name) in str(info.value)
    assert isinstance(info.value, WakefulError)
