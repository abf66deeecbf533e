"""Entity types: name, description, declared state collections, args schema, handler.

The registry is the top of the handler API: a handler takes a
:class:`HandlerContext`, so this module imports the context (and nothing below it
imports the registry).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .context import HandlerContext
from .contracts import AgentDef, check_one_contract_per_id
from .errors import DuplicateTypeError, InvalidArgsError, UnknownEntityTypeError
from .runtime_tools import runtime_tool_manifest
from .schema import Collection
from .urls import validate_type_name

__all__ = ["Collection", "EntityType", "Handler", "Registry"]

Handler = Callable[[HandlerContext], Awaitable[None]]
_COLLECTION_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class EntityType:
    name: str
    handler: Handler
    description: str = ""
    state: dict[str, Collection[Any]] = field(default_factory=dict)
    args: type | None = None

    def validate_args(self, args: Any) -> Any:
        """Return args converted to builtins after checking them against ``self.args``."""
        if self.args is None:
            return msgspec.to_builtins(args) if args is not None else None
        try:
            typed: Any = msgspec.convert(msgspec.to_builtins(args), self.args)
        except (msgspec.ValidationError, TypeError) as exc:
            raise InvalidArgsError(self.name, str(exc)) from exc
        return msgspec.to_builtins(typed)

    def typed_args(self, args: Any) -> Any:
        if self.args is None or args is None:
            return args
        return msgspec.convert(args, self.args)

    def manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "args_schema": msgspec.json.schema(self.args) if self.args is not None else None,
            "collections": {
                name: {"primary_key": c.primary_key, "row_schema": c.row_schema()}
                for name, c in self.state.items()
            },
        }


class Registry:
    """The set of entity types a worker can run and a client can address."""

    def __init__(self) -> None:
        self._types: dict[str, EntityType] = {}
        self._agents: dict[str, AgentDef] = {}

    def agent(self, agent: AgentDef) -> AgentDef:
        """Record an agent definition (``define_agent``) so the manifest lists its contract."""
        if agent.name in self._agents:
            raise DuplicateTypeError(f"agent {agent.name!r} is already registered")
        check_one_contract_per_id(  # one id, one contract across the registry's agents
            (f"agent {a.name!r}, key {key!r}", reg.tool)
            for a in [*self._agents.values(), agent]
            for key, reg in a.registrations().items()
        )
        self._agents[agent.name] = agent
        return agent

    def agent_named(self, name: str) -> AgentDef | None:
        """The agent recorded under ``name`` (``agent()``), if any."""
        return self._agents.get(name)

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        description: str = "",
        state: dict[str, Collection[Any]] | None = None,
        args: type | None = None,
    ) -> EntityType:
        validate_type_name(name)
        if name in self._types:
            raise DuplicateTypeError(f"entity type {name!r} is already registered")
        if not callable(handler):
            raise TypeError(f"handler of entity type {name!r} must be an async callable")
        collections = dict(state or {})
        for cname, coll in collections.items():
            if not isinstance(cname, str) or not _COLLECTION_RE.fullmatch(cname):
                raise ValueError(
                    f"collection name {cname!r} of entity type {name!r} must match "
                    "[a-z][a-z0-9_]* (at most 64 characters)"
                )
            if not isinstance(coll, Collection):
                raise TypeError(f"collection {cname!r} of {name!r} must be a Collection")
            if coll.row is not None and coll.primary_key not in getattr(
                coll.row, "__struct_fields__", ()
            ):
                raise ValueError(
                    f"collection {cname!r} of {name!r}: row type {coll.row.__name__} has no "
                    f"field {coll.primary_key!r} to use as primary key"
                )
        entity_type = EntityType(name, handler, description, collections, args)
        self._types[name] = entity_type
        return entity_type

    def entity(
        self,
        name: str,
        *,
        description: str = "",
        state: dict[str, Collection[Any]] | None = None,
        args: type | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""

        def decorate(handler: Handler) -> Handler:
            self.register(name, handler, description=description, state=state, args=args)
            return handler

        return decorate

    def get(self, name: str) -> EntityType:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownEntityTypeError(name, list(self._types)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[EntityType]:
        return iter(self._types.values())

    def names(self) -> list[str]:
        return list(self._types)

    def manifest(self) -> dict[str, Any]:
        return {
            "version": 1,
            "types": [t.manifest() for t in self._types.values()],
            "agents": [a.manifest() for a in self._agents.values()],
            "runtime_tools": runtime_tool_manifest(),  # ctx.runtime_tools
        }

    def manifest_json(self) -> str:
        return json.dumps(self.manifest(), indent=2, sort_keys=False)
