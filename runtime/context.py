"""What a handler sees: :class:`HandlerContext`, and the ``Wake`` subscription specs."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from .events import (
    CancelRequested,
    Changed,
    ChildRunFinished,
    Created,
    DeliveryFailed,
    Effect,
    Event,
    LogRecord,
    Message,
    Subscription,
)
from .state import ChildInfo, Database
from .status import EntityStatus, Schedule
from .streamids import id_gt
from .urls import entity_url, parse_url

if TYPE_CHECKING:
    from .activation import Activation
    from .agent import Agent, AgentTool
    from .contracts import AgentDef, CapabilityPool
    from .live import LivePublisher
    from .models import Model
    from .registry import EntityType

_NO_MESSAGE: Any = object()


class Wake:
    """Subscription specs for ``ctx.spawn(wake=...)`` and ``ctx.observe(wake=...)``."""

    @staticmethod
    def run_finished(include_response: bool = True) -> Subscription:
        """Wake me each time a run of that entity finishes (with its response)."""
        return Subscription(kind="run_finished", include_response=include_response)

    @staticmethod
    def change(collections: list[str] | None = None, debounce: float = 0.0) -> Subscription:
        """Wake me when those collections change; with ``debounce`` (seconds), once per burst."""
        if debounce < 0:
            raise ValueError(f"debounce must be >= 0 seconds, got {debounce}")
        return Subscription(
            kind="change",
            collections=list(collections) if collections is not None else None,
            debounce_ms=int(debounce * 1000),
        )


class CancelSignal:
    """Set when the wake must stop.

    ``kind`` says why: ``"cancel"`` (a client cancelled the run: finish it as
    cancelled), ``"lease"`` (the worker lost the partition) or ``"shutdown"``
    (the worker is stopping). For the last two the wake's work is not lost: it
    resumes on the next owner.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: str | None = None
        self.kind: Literal["cancel", "lease", "shutdown"] | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str, kind: Literal["cancel", "lease", "shutdown"] = "cancel") -> None:
        if not self._event.is_set():
            self.reason = reason
            self.kind = kind
            self._event.set()

    async def wait(self) -> str | None:
        await self._event.wait()
        return self.reason

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise asyncio.CancelledError(self.reason)


@dataclass(frozen=True)
class WakeInfo:
    """Why the handler runs: the input events after the entity's cursor, in log order.

    A retried wake can follow an attempt that got past a commit point
    (``ctx.flush()``, an agent step) before it crashed or failed: what that
    attempt wrote up to there is durable and is in ``ctx.db`` now, and the
    handler runs again from the top. ``resumed_upto`` is then the last input
    that attempt had (inputs after it arrived since), and ``attempted(record)``
    tells whether an input was among them: work done for such an input before a
    commit point must be safe to redo, or be skipped (the agent loop resumes
    from its journal this way).
    """

    events: list[LogRecord]
    resumed_upto: str | None = None

    @property
    def resumed(self) -> bool:
        """An earlier attempt at (some of) these inputs got past a commit point."""
        return self.resumed_upto is not None

    def attempted(self, record: LogRecord | str) -> bool:
        """Whether an earlier attempt that got past a commit point had this input."""
        if self.resumed_upto is None:
            return False
        record_id = record if isinstance(record, str) else record.id
        return not id_gt(record_id, self.resumed_upto)

    @property
    def id(self) -> str:
        """The wake's identity: the id of its first input (stable when the wake is retried)."""
        return self.events[0].id if self.events else "0-0"

    @property
    def messages(self) -> list[Message]:
        return self.of_type(Message)

    @property
    def created(self) -> Created | None:
        found = self.of_type(Created)
        return found[0] if found else None

    @property
    def runs_finished(self) -> list[ChildRunFinished]:
        """Finished runs of entities this one waits on (``Wake.run_finished``)."""
        return self.of_type(ChildRunFinished)

    @property
    def changes(self) -> list[Changed]:
        return self.of_type(Changed)

    @property
    def cancelled(self) -> CancelRequested | None:
        found = self.of_type(CancelRequested)
        return found[-1] if found else None

    @property
    def delivery_failures(self) -> list[DeliveryFailed]:
        return self.of_type(DeliveryFailed)

    @property
    def kinds(self) -> list[str]:
        return [type(r.event).__struct_config__.tag for r in self.events]  # type: ignore[attr-defined]

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [r.event for r in self.events if isinstance(r.event, kind)]


class Services(Protocol):
    """What the context needs from the worker (``wakeful.services.HandlerServices``)."""

    async def entity_type(self, type_name: str) -> EntityType | None:
        """The registered type; None if only another worker's registry has it; raises
        UnknownEntityTypeError if nobody registered it."""
        ...

    async def status(self, url: str) -> EntityStatus: ...

    async def schedules(self, url: str, created: str) -> list[Schedule]: ...

    async def cancel_schedule(self, url: str, created: str, schedule_id: str) -> bool: ...

    def capabilities_for(self, url: str) -> CapabilityPool: ...


class EntityHandle:
    """A handle on another entity, from ``ctx.spawn`` (or :meth:`HandlerContext.handle`)."""

    def __init__(self, ctx: HandlerContext, url: str) -> None:
        self._ctx = ctx
        self.entity_url = url

    async def send(
        self, payload: Any, *, after: float | dt.timedelta | dt.datetime | None = None
    ) -> None:
        await self._ctx.send(self.entity_url, payload, after=after)

    async def status(self) -> EntityStatus:
        """Its current status (raises EntityNotFoundError until the spawn is delivered)."""
        return await self._ctx._services.status(self.entity_url)

    def __repr__(self) -> str:
        return f"<EntityHandle {self.entity_url}>"


def _due_ms(after: float | dt.timedelta | dt.datetime) -> int:
    if isinstance(after, dt.datetime):
        if after.tzinfo is None:
            raise ValueError("after= as a datetime must be timezone-aware")
        return int(after.timestamp() * 1000)
    seconds = after.total_seconds() if isinstance(after, dt.timedelta) else float(after)
    if seconds < 0:
        raise ValueError(f"after= must not be negative, got {seconds}s")
    return int((time.time() + seconds) * 1000)


class HandlerContext:
    """Everything a handler may use during one wake."""

    def __init__(
        self,
        *,
        entity_url: str,
        entity_type: str,
        entity_id: str,
        args: Any,
        wake: WakeInfo,
        first_wake: bool,
        db: Database,
        signal: CancelSignal,
        flush: Callable[[], Awaitable[None]],
        activation: Activation,
        services: Services,
        live: LivePublisher,
    ) -> None:
        self.entity_url = entity_url
        self.entity_type = entity_type
        self.entity_id = entity_id
        self.args = args
        self.wake = wake
        self.first_wake = first_wake
        self.db = db
        self.signal = signal
        self._flush = flush
        self._activation = activation
        self._services = services
        self._live = live
        self._agent: Agent | None = None

    # -- the agent loop ------------------------------------------------------------

    def use_agent(
        self,
        system_prompt: str | AgentDef,
        model: str | Model | None = None,
        tools: list[AgentTool] | None = None,
        **options: Any,
    ) -> Agent:
        """Set up the agent loop for this wake; run it with ``await ctx.agent.run()``.

        Either the plain style (``system_prompt``, ``model``, ``tools`` as
        ``AgentTool``s) or a typed agent from ``define_agent`` (its registrations
        are checked here, before any model call). ``model`` is a ``claude-*``
        name (the Anthropic API; ``ANTHROPIC_API_KEY`` must be set, checked
        here) or a :class:`Model` such as ``ScriptedModel``. Options:
        ``max_steps``, ``max_run_tokens``, ``max_output_tokens``,
        ``tool_concurrency``.
        """
        from .agent import Agent
        from .contracts import AgentDef, loop_result_hook, resolve_tools

        if isinstance(system_prompt, AgentDef):
            definition = system_prompt
            agent = Agent(
                self,
                system_prompt=definition.instructions,
                model=model or definition.model,
                tools=list(tools or []),
                **{**definition.options, **options},
            )
            for tool in resolve_tools(definition, self, agent.caller):
                agent.add_tool(tool)
            agent.after_tool_result = loop_result_hook(definition, agent.caller, self)
        else:
            if model is None:
                raise TypeError("use_agent needs a model (a claude-* name or a Model)")
            agent = Agent(self, system_prompt=system_prompt, model=model, tools=tools, **options)
        self._agent = agent
        return agent

    @property
    def agent(self) -> Agent:
        if self._agent is None:
            raise RuntimeError("call ctx.use_agent(...) before using ctx.agent")
        return self._agent

    @property
    def runtime_tools(self) -> list[AgentTool]:
        """The runtime's own tools: send a message, dispatch a child agent, schedule a message."""
        from .runtime_tools import runtime_tools

        return runtime_tools(self)

    @functools.cached_property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that names the entity (``wakeful.entity.<type>``)."""
        return logging.LoggerAdapter(
            logging.getLogger(f"wakeful.entity.{self.entity_type}"), {"entity": self.entity_url}
        )

    async def flush(self) -> None:
        """A commit point: make writes and effects so far durable, and deliver the effects."""
        await self._flush()

    # -- runs ----------------------------------------------------------------------

    def record_run(self) -> str:
        """Open a run (if none is open) and return its id. Runs group an entity's work;
        a finished run wakes the entities subscribed with ``Wake.run_finished``."""
        return self._activation.record_run()

    def reply(self, text: str) -> str:
        """Finish the current run (opening one if needed) as completed with ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"reply text must be a str, not {type(text).__name__}")
        return self._activation.finish_run("completed", response=text)

    def fail_run(self, error: str) -> str:
        """Finish the current run as failed with ``error``."""
        return self._activation.finish_run("failed", error=str(error))

    @property
    def current_run(self) -> str | None:
        return self._activation.current_run

    # -- other entities ------------------------------------------------------------

    def derive_id(self, prefix: str) -> str:
        """An id for a child that is the same when this wake is replayed.

        ``f"dispatch-{time.time()}"`` would create a second child on replay;
        ``ctx.derive_id("dispatch")`` gives ``dispatch-<wake id>-<n>``, where n
        counts the calls in this wake.
        """
        return self._activation.derive_id(prefix)

    @property
    def children(self) -> list[ChildInfo]:
        """The entities this one spawned, with the status of their last finished run."""
        return list(self._activation.state.system.children.values())

    def handle(self, url: str) -> EntityHandle:
        parse_url(url)
        return EntityHandle(self, url)

    async def _check_type(self, type_name: str) -> EntityType | None:
        return await self._services.entity_type(type_name)

    async def send(
        self,
        url: str,
        payload: Any,
        *,
        after: float | dt.timedelta | dt.datetime | None = None,
    ) -> None:
        """Send a message to another entity (or to itself). It leaves at the next commit
        point. With ``after`` (seconds, a timedelta or an aware datetime) it is a
        durable timer: it fires once, even if every worker restarts meanwhile."""
        target = parse_url(url)
        await self._check_type(target.type)
        act = self._activation
        act.add_effect(
            Effect(
                kind="send",
                target=url,
                key=act.next_key(),
                payload=msgspec.to_builtins(payload),
                has_payload=True,
                due_ms=_due_ms(after) if after is not None else 0,
            )
        )

    async def spawn(
        self,
        type_name: str,
        entity_id: str,
        args: Any = None,
        *,
        initial_message: Any = _NO_MESSAGE,
        wake: Subscription | None = None,
        tags: dict[str, str] | None = None,
        on_parent_close: Literal["cancel", "keep"] = "cancel",
    ) -> EntityHandle:
        """Create a child entity (get-or-create) and return its handle.

        With ``wake=Wake.run_finished()`` this entity is woken each time a run of
        the child finishes, with the child's response in ``ctx.wake.runs_finished``.
        Spawning an existing child with the same args returns its handle; with
        other args it raises :class:`ArgsConflictError`. ``on_parent_close``
        says whether the child is cancelled when this entity is cancelled or
        deleted.
        """
        from .errors import ArgsConflictError, EntityNotFoundError

        url = entity_url(type_name, entity_id)
        child_type = await self._check_type(type_name)
        clean_args = (
            child_type.validate_args(args) if child_type is not None else msgspec.to_builtins(args)
        )
        if on_parent_close not in ("cancel", "keep"):
            raise ValueError(f"on_parent_close must be 'cancel' or 'keep', not {on_parent_close!r}")
        known = self._activation.state.system.children.get(url)
        if known is not None:
            existing_args: Any = known.args
        elif entity_id in self._activation.derived:
            # Derived from this wake: only a replay of it can have made this child (with
            # these args), so skip the lookup; delivery still reports a conflict.
            existing_args = clean_args
        else:
            try:
                existing_args = (await self._services.status(url)).args
            except EntityNotFoundError:
                existing_args = clean_args
        if existing_args != clean_args:
            raise ArgsConflictError(url)
        act = self._activation
        has_message = initial_message is not _NO_MESSAGE
        act.add_effect(
            Effect(
                kind="spawn",
                target=url,
                key=act.next_key(),
                payload=msgspec.to_builtins(initial_message) if has_message else None,
                has_payload=has_message,
                args=clean_args,
                subscribe=wake,
                on_parent_close=on_parent_close,
                tags=tags,
            )
        )
        return EntityHandle(self, url)

    async def schedules(self) -> list[Schedule]:
        """This entity's pending timers (``send(..., after=...)``), soonest first.

        A timer set in this wake is listed once the wake has committed it."""
        act = self._activation
        return await self._services.schedules(self.entity_url, act.created)

    async def cancel_schedule(self, schedule_id: str) -> bool:
        """Cancel a pending timer; False if it already fired or was cancelled."""
        act = self._activation
        return await self._services.cancel_schedule(self.entity_url, act.created, schedule_id)

    async def observe(self, url: str, *, wake: Subscription) -> None:
        """Subscribe to another entity: ``Wake.change(...)`` or ``Wake.run_finished()``."""
        target = parse_url(url)
        await self._check_type(target.type)
        act = self._activation
        act.add_effect(Effect(kind="subscribe", target=url, key=act.next_key(), subscribe=wake))

    def __repr__(self) -> str:
        return f"<HandlerContext {self.entity_url} wake={self.wake.kinds}>"


__all__ = ["CancelSignal", "EntityHandle", "Event", "HandlerContext", "Wake", "WakeInfo"]
