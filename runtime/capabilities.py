"""Capabilities: lifecycle-bound resources a tool declares (a sandbox, a browser).

A :class:`Capability` is bound when the runtime is created; the worker keeps one
:class:`CapabilityPool` per entity, which provisions each resource on first use
and cleans them up; a tool sees the resources it declared as ``ctx.capabilities``
(:class:`Capabilities`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Out = TypeVar("Out")

__all__ = ["Capabilities", "Capability", "CapabilityPool"]


@dataclass(frozen=True)
class Capability(Generic[Out]):
    """A lifecycle-bound resource (a sandbox per conversation, a browser per user).

    Bound when the runtime is created (``Runtime(capabilities=[...])``),
    provisioned lazily per entity on first use by a tool that declares it, and
    cleaned up when the entity is deleted or evicted from the worker's cache,
    and when the worker shuts down.
    """

    name: str
    provision: Callable[[str], Awaitable[Out]]  # entity url -> resource
    cleanup: Callable[[Out], Awaitable[None]] | None = None


class CapabilityPool:
    """The capabilities of one entity on one worker: provisioned once, on first use."""

    def __init__(self, url: str, bound: Mapping[str, Capability[Any]]) -> None:
        self.url = url
        self._bound = bound
        self._resources: dict[str, asyncio.Future[Any]] = {}

    @property
    def bound(self) -> set[str]:
        return set(self._bound)

    async def get(self, name: str) -> Any:
        if name not in self._resources:  # one provisioning even for concurrent first uses
            self._resources[name] = asyncio.ensure_future(self._bound[name].provision(self.url))
        return await self._resources[name]

    async def cleanup(self) -> None:
        """Release every provisioned resource (entity deleted or evicted, worker stopping)."""
        resources, self._resources = self._resources, {}
        for name, future in resources.items():
            cleanup = self._bound[name].cleanup
            if cleanup is None or not future.done() or future.exception() is not None:
                continue
            try:
                await cleanup(future.result())
            except Exception:
                logging.getLogger("wakeful.capabilities").exception(
                    "cleanup of capability %r of %s failed", name, self.url
                )


class Capabilities:
    """``ctx.capabilities``: the provisioned resources, by name."""

    def __init__(self, resources: Mapping[str, Any]) -> None:
        self._resources = dict(resources)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._resources[name]
        except KeyError:
            known = ", ".join(sorted(self._resources)) or "none"
            raise AttributeError(
                f"capability {name!r} was not declared by this tool (declared: {known})"
            ) from None
