"""The registry: registering entity types, validation of declarations, the manifest."""

from __future__ import annotations

import json

import msgspec
import pytest

from wakeful import (
    Collection,
    DuplicateTypeError,
    EntityType,
    HandlerContext,
    InvalidArgsError,
    InvalidTypeNameError,
    Registry,
    UnknownEntityTypeError,
)


class Note(msgspec.Struct):
    key: str
    value: str
    tags: list[str] = []


class Task(msgspec.Struct):
    id: int
    title: str
    done: bool = False


class Args(msgspec.Struct):
    topic: str
    depth: int = 1


async def noop(ctx: HandlerContext) -> None:
    return None


def test_register_call_form_returns_the_entity_type() -> None:
    reg = Registry()
    et = reg.register(
        "assistant", noop, description="helps", state={"kv": Collection(row=Note)}, args=Args
    )
    assert isinstance(et, EntityType)
    assert reg.get("assistant") is et
    assert et.name == "assistant"
    assert et.handler is noop
    assert et.description == "helps"
    assert et.state == {"kv": Collection(primary_key="key", row=Note)}
    assert et.args is Args
    assert "assistant" in reg
    assert "other" not in reg
    assert reg.names() == ["assistant"]
    assert list(reg) == [et]


def test_decorator_form_registers_and_returns_the_handler() -> None:
    reg = Registry()

    @reg.entity("researcher", description="finds things", state={"tasks": Collection("id", Task)})
    async def researcher(ctx: HandlerContext) -> None:
        return None

    # The decorator gives back the function itself, still callable as before.
    assert callable(researcher)
    assert researcher.__name__ == "researcher"
    et = reg.get("researcher")
    assert et.handler is researcher
    assert et.description == "finds things"
    assert et.state["tasks"].primary_key == "id"
    assert et.state["tasks"].row is Task


def test_registration_order_is_kept() -> None:
    reg = Registry()
    for name in ["zeta", "alpha", "mid"]:
        reg.register(name, noop)
    assert reg.names() == ["zeta", "alpha", "mid"]
    assert [t["name"] for t in reg.manifest()["types"]] == ["zeta", "alpha", "mid"]


def test_duplicate_type_is_rejected_and_the_first_is_kept() -> None:
    reg = Registry()
    reg.register("assistant", noop, description="first")

    async def other(ctx: HandlerContext) -> None:
        return None

    with pytest.raises(DuplicateTypeError, match="'assistant' is already registered"):
        reg.register("assistant", other, description="second")
    with pytest.raises(DuplicateTypeError):
        reg.entity("assistant")(other)
    assert reg.get("assistant").description == "first"
    assert reg.get("assistant").handler is noop


@pytest.mark.parametrize(
    "name", ["", "Assistant", "9lives", "with space", "a/b", "a.b", "x" * 65, None, 12]
)
def test_malformed_type_names_are_rejected(name: object) -> None:
    reg = Registry()
    with pytest.raises(InvalidTypeNameError, match="invalid entity type name"):
        reg.register(name, noop)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeNameError):
        reg.entity(name)(noop)  # type: ignore[arg-type]
    assert reg.names() == []


def test_handler_must_be_callable() -> None:
    reg = Registry()
    with pytest.raises(TypeError, match="must be an async callable"):
        reg.register("assistant", "not a function")  # type: ignore[arg-type]
    assert "assistant" not in reg


@pytest.mark.parametrize(
    "cname", ["", "Notes", "1notes", "my-notes", "my notes", "n" * 65, "_private", 5]
)
def test_bad_collection_names_are_rejected(cname: object) -> None:
    reg = Registry()
    with pytest.raises(ValueError, match=r"collection name .* must match"):
        reg.register("assistant", noop, state={cname: Collection()})  # type: ignore[dict-item]
    assert "assistant" not in reg


def test_good_collection_names_are_accepted() -> None:
    reg = Registry()
    names = ["kv", "notes_2", "n" * 64, "a"]
    reg.register("assistant", noop, state={n: Collection() for n in names})
    assert list(reg.get("assistant").state) == names


def test_collection_must_be_a_collection() -> None:
    reg = Registry()
    with pytest.raises(TypeError, match="must be a Collection"):
        reg.register("assistant", noop, state={"kv": {"primary_key": "key"}})  # type: ignore[dict-item]


def test_row_type_without_the_primary_key_field_is_rejected() -> None:
    reg = Registry()
    with pytest.raises(ValueError, match=r"row type Note has no field 'id'"):
        reg.register("assistant", noop, state={"kv": Collection(primary_key="id", row=Note)})
    assert "assistant" not in reg
    # The same row type with a primary key it does have is fine.
    reg.register("assistant", noop, state={"kv": Collection(primary_key="value", row=Note)})


def test_unknown_type_lists_the_registered_ones() -> None:
    reg = Registry()
    reg.register("beta", noop)
    reg.register("alpha", noop)
    with pytest.raises(UnknownEntityTypeError) as info:
        reg.get("gamma")
    assert info.value.type_name == "gamma"
    assert "unknown entity type 'gamma'" in str(info.value)
    assert "registered types: alpha, beta" in str(info.value)


def test_validate_args_against_the_args_struct() -> None:
    reg = Registry()
    et = reg.register("researcher", noop, args=Args)
    assert et.validate_args({"topic": "bees"}) == {"topic": "bees", "depth": 1}
    assert et.validate_args(Args("ants", 3)) == {"topic": "ants", "depth": 3}
    with pytest.raises(InvalidArgsError, match=r"args rejected by entity type 'researcher'.*topic"):
        et.validate_args({"depth": 2})
    with pytest.raises(InvalidArgsError, match=r"Expected `int`, got `str`"):
        et.validate_args({"topic": "bees", "depth": "deep"})
    assert et.typed_args({"topic": "x", "depth": 2}) == Args("x", 2)
    # Without an args type anything encodable passes through as builtins.
    free = reg.register("free", noop)
    assert free.validate_args(None) is None
    assert free.validate_args(Args("y")) == {"topic": "y", "depth": 1}


def test_manifest_json_describes_types_collections_and_schemas() -> None:
    reg = Registry()
    reg.register(
        "assistant",
        noop,
        description="Assistant with memory",
        state={"kv": Collection(primary_key="key", row=Note), "loose": Collection("name")},
        args=Args,
    )
    reg.register("plain", noop)

    manifest = json.loads(reg.manifest_json())
    assert manifest["version"] == 1
    assert [t["name"] for t in manifest["types"]] == ["assistant", "plain"]
    assistant, plain = manifest["types"]

    assert assistant["description"] == "Assistant with memory"
    assert plain["description"] == ""
    assert plain["collections"] == {}
    assert plain["args_schema"] is None

    kv = assistant["collections"]["kv"]
    assert kv["primary_key"] == "key"
    note_schema = kv["row_schema"]["$defs"]["Note"]
    assert note_schema["type"] == "object"
    assert note_schema["required"] == ["key", "value"]
    assert note_schema["properties"]["key"] == {"type": "string"}
    assert note_schema["properties"]["value"] == {"type": "string"}
    assert note_schema["properties"]["tags"]["type"] == "array"
    assert note_schema["properties"]["tags"]["items"] == {"type": "string"}
    assert kv["row_schema"]["$ref"] == "#/$defs/Note"

    assert assistant["collections"]["loose"] == {"primary_key": "name", "row_schema": None}

    args_schema = assistant["args_schema"]["$defs"]["Args"]
    assert args_schema["required"] == ["topic"]
    assert args_schema["properties"]["topic"] == {"type": "string"}
    assert args_schema["properties"]["depth"] == {"type": "integer", "default": 1}

    # The JSON form is exactly the dict form.
    assert manifest == reg.manifest()
