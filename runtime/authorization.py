"""Who may read or write which entity through the gateway: authorisation policies.

The gateway turns a request into a trusted identity (its authenticator) and then
asks an :data:`Authorizer` whether that identity may ``read`` or ``write`` the
entity, given what it knows of the entity: whether it exists, and its owner (the
identity that created it, recorded by the SEND script at creation; None when it
was created without one: by the CLI without ``--identity``, by a gateway without
tokens, by an entity whose run had none). Listings show only the entities the
caller may read.

Policies (``wakeful serve --authorizer``):

* :func:`owner_only` (``owner``, the default when the gateway authenticates): an
  entity belongs to the identity that created it. Its owner may read and write it;
  any other identity gets 403 for both. A missing entity may be created by anyone,
  who becomes its owner. An entity without a recorded owner is reachable only by
  callers without an identity, so never by a token holder.
* :func:`allow_all` (``allow-all``, the default without authentication): every
  caller may read and write every entity.
* ``module:function``: any callable taking an :class:`EntityAccess` and returning
  a bool (or an awaitable of one).

The decision and the write are one step: a create or a message carries the owner
the policy saw (:func:`wakeful.keys.owner_mark`), the SEND script refuses it if
the entity's owner changed meanwhile (created by another, deleted, re-created),
and the gateway decides again. (A cancel or an answer needs the entity to exist
already.) A policy's answer counts only if it is ``True``. Reading a missing entity is a 404 whatever the policy says
(the entity may be created by someone else between the check and the read).
Answers to pending actions are checked again, against the identity of the run
that asked (``wakeful.actions``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from .errors import ConfigError
from .keys import owner_mark

if TYPE_CHECKING:
    from .client import Runtime

Identity = dict[str, str]
Access = Literal["read", "write"]


@dataclass(frozen=True, slots=True)
class EntityAccess:
    """One question to an authoriser: may ``identity`` ``access`` the entity ``url``?"""

    identity: Identity | None  # the authenticated caller (None: the gateway authenticates no one)
    url: str
    access: Access
    exists: bool
    owner: Identity | None  # the identity that created it (None: none recorded, or missing)

    @property
    def mark(self) -> str:
        """The owner as the write's check compares it (``keys.owner_mark``)."""
        return owner_mark(self.owner, exists=self.exists)


Authorizer = Callable[[EntityAccess], bool | Awaitable[bool]]


def owner_only(request: EntityAccess) -> bool:
    """An entity belongs to the identity that created it (see the module docstring)."""
    if not request.exists:
        return True  # a write creates it, owned by the caller; a read finds nothing (404)
    return request.owner == request.identity


def allow_all(request: EntityAccess) -> bool:
    """Every caller may read and write every entity."""
    return True


POLICIES: dict[str, Authorizer] = {"owner": owner_only, "allow-all": allow_all}


def load_authorizer(spec: str) -> Authorizer:
    """``owner``, ``allow-all``, or ``module:function`` (imported as an app is, the
    current directory first)."""
    if spec in POLICIES:
        return POLICIES[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--authorizer {spec!r} must be 'owner', 'allow-all' or module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--authorizer: cannot import module {module_name!r}: {exc}") from exc
    policy = getattr(module, attr, None)
    if not callable(policy):
        raise ConfigError(f"--authorizer: {spec!r} is not a function of the module")
    return cast("Authorizer", policy)


async def allowed(authorize: Authorizer, request: EntityAccess) -> bool:
    """The authoriser's answer (awaited if it is a coroutine function's)."""
    answer = authorize(request)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer is True


async def check(
    authorize: Authorizer, runtime: Runtime, identity: Identity | None, url: str, access: Access
) -> EntityAccess | None:
    """Ask ``authorize`` about one entity; the question if allowed, else None."""
    exists, owner = await runtime.ownership(url)
    request = EntityAccess(identity, url, access, exists, owner)
    return request if await allowed(authorize, request) else None


async def readable(
    authorize: Authorizer,
    runtime: Runtime,
    identity: Identity | None,
    urls: list[str],
    limit: int,
) -> list[str]:
    """The first ``limit`` of ``urls`` that ``identity`` may read (owners read in batches)."""
    out: list[str] = []
    batch = max(limit, 100)
    for start in range(0, len(urls), batch):
        chunk = urls[start : start + batch]
        for url, (exists, owner) in zip(chunk, await runtime.ownerships(chunk), strict=True):
            if await allowed(authorize, EntityAccess(identity, url, "read", exists, owner)):
                out.append(url)
                if len(out) == limit:
                    return out
    return out
