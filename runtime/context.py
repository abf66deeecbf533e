"""What a handler sees: :class:`HandlerContext`.

The context is the top of the handler API below the registry: it builds the
agent loop (``ctx.use_agent``) and the runtime's tools, so it imports them and
they never import it. The small types a handler also meets live lower down
(``CancelSignal`` in cancellation.py, ``Wake`` and ``WakeInfo`` in wake.py) and
are re-exported here.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from .activation import Activation
from .agent import Agent, AgentTool, AgentWake
from .agent_options import check_agent_options, check_combination
from .cancellation import CancelSignal
from .capabilities import CapabilityPool
from .compaction import reset_event
from .contracts import AgentDef
from .database import Database
from .errors import ArgsConflictError, EntityNotFoundError
from .events import Effect, Event, Subscription, ToolData, encode_event
from .live import LivePublisher
from .models import Model
from .resolution import loop_result_hook, resolve_tools
from .runtime_tools import runtime_tools
from .schedules import CronSchedule, check_id
from .state import ChildInfo
from .status import EntityStatus, Schedule
from .urls import entity_url, parse_url
from .wake import Wake, WakeInfo

if TYPE_CHECKING:
    from .registry import EntityType  # the registry sits above the context

_NO_MESSAGE: Any = object()


class Services(Protocol):
    """What the context needs from the worker (``wakeful.services.HandlerServices``)."""

    async def entity_type(self, type_name: str) -> EntityType | None:
        """The registered type; None if only another worker's registry has it; raises
        UnknownEntityTypeError if nobody registered it."""
        ...

    async def status(self, url: str) -> EntityStatus: ...

    async def schedules(self, url: str, created: str) -> list[Schedule]: ...

    async def cancel_schedule(self, url: str, created: str, schedule_id: str) -> bool: ...

    async def upsert_cron_schedule(
        self,
        url: str,
        created: str,
        schedule_id: str,
        expression: str,
        timezone: str,
        payload: Any,
        limit: int,
    ) -> CronSchedule: ...

    async def cron_schedules(self, url: str, created: str) -> list[CronSchedule]: ...

    async def delete_cron_schedule(self, url: str, created: str, schedule_id: str) -> bool: ...

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
        here) or a :class:`Model` such as ``ScriptedModel``. Options (see
        agent_options.py; over a definition's own): ``max_steps``,
        ``max_run_tokens``, ``max_output_tokens``, ``tool_concurrency``, the
        context options, the request options (``thinking``, ``tool_choice``, ...)
        and ``output_type``; checked alone and together, a bad one is a
        :class:`ToolContractError` naming it.
        """
        check_agent_options(options, "use_agent")
        wake = AgentWake(
            entity_url=self.entity_url,
            inputs=self.wake.events,
            activation=self._activation,
            live=self._live,
            signal=self.signal,
            flush=self.flush,
            log=self.log,
        )
        if isinstance(system_prompt, AgentDef):
            definition = system_prompt
            merged = {**definition.options, **options}
            agent = Agent(
                wake,
                system_prompt=definition.instructions,
                model=model or definition.model,
                tools=list(tools or []),
                **merged,
            )
            for tool in resolve_tools(definition, self, agent.caller, self._capabilities()):
                agent.add_tool(tool)
            check_combination(merged, "use_agent", agent.tools)
            agent.after_tool_result = loop_result_hook(definition, agent.caller, self)
            agent.on_runtime_error = definition.on_runtime_error
            agent.agent_name = definition.name
        else:
            if model is None:
                raise TypeError("use_agent needs a model (a claude-* name or a Model)")
            agent = Agent(wake, system_prompt=system_prompt, model=model, tools=tools, **options)
            check_combination(options, "use_agent", agent.tools)
        self._agent = agent
        return agent

    @property
    def agent(self) -> Agent:
        if self._agent is None:
            raise RuntimeError("call ctx.use_agent(...) before using ctx.agent")
        return self._agent

    async def compact_conversation(self) -> bool:
        """Summarise the older turns of the agent's conversation now (needs
        ``use_agent``: its model writes the summary); the open run and the agent's
        last ``keep_turns`` turns stay as they are. Committed at once. False if there
        was nothing to compact."""
        return await self.agent.compact_conversation()

    async def reset_conversation(self) -> bool:
        """Drop every turn of the agent's conversation before the open run (all of them
        if none is open); the journal in the log keeps them. Committed at once. False
        if there was nothing to drop."""
        if self._agent is not None:
            return await self._agent.reset_conversation()
        system = self._activation.state.system
        event = reset_event(system.history, system.run)
        if event is None:
            return False
        self._activation.record(event)
        await self.flush()
        return True

    @property
    def runtime_tools(self) -> list[AgentTool]:
        """The runtime's own tools: send a message, dispatch a child agent, schedule a message."""
        return runtime_tools(self)

    def set_tool_data(self, tool_call_id: str, data: Any) -> None:
        """Set the tool data of a call: public per-call state that renderers read
        (beside its input and output): live at once, durable with the call's result
        (committed with it), in the log, the SSE stream and the console. The latest
        write wins.
        Typed tools call ``ctx.set_data(...)`` on their ToolContext, which comes here."""
        event = ToolData(
            tool_call_id=tool_call_id,
            data=msgspec.to_builtins(data),
            at_ms=int(time.time() * 1000),
        )
        # Encoded now, so data that is too big or not encodable fails at the call.
        encode_event(event, limit=self._activation.limit, what=f"tool data of {tool_call_id!r}")
        self._activation.record(event)
        self._live.tool_data(tool_call_id, event.data)  # renderers see it at once

    def _capabilities(self) -> CapabilityPool:
        """The capabilities of this entity on this worker (for the tools of a typed agent)."""
        return self._services.capabilities_for(self.entity_url)

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
        ``ctx.derive_id("dispatch")`` gives ``dispatch-<16 hex digits>``, a digest of
        this entity, the wake, the tool call it is made in (if any) and the call's
        position there: the same on every replay, and never the same for two parents.
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
        durable timer: it fires once, even if every worker restarts meanwhile. The
        message carries the identity this wake acts for (its run's)."""
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
                identity=act.identity,
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
        deleted. The child, and its initial message, get the identity this wake
        acts for (its run's): the child's runs belong to it.
        """
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
                identity=act.identity,
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

    async def upsert_cron_schedule(
        self,
        schedule_id: str,
        expression: str,
        *,
        timezone: str = "UTC",
        payload: Any = None,
    ) -> CronSchedule:
        """Create or replace this entity's recurring schedule ``schedule_id``: at each
        occurrence of the cron ``expression`` (5 fields, in the IANA ``timezone``) the
        entity gets a message with ``payload`` from ``schedule:<id>``.

        Written at once (not at the next commit point) and fenced by the lease; upserting
        the same schedule again (a retried wake) keeps its next occurrence. Raises
        InvalidScheduleError naming a bad id, expression or time zone."""
        act = self._activation
        return await self._services.upsert_cron_schedule(
            self.entity_url, act.created, schedule_id, expression, timezone, payload, act.limit
        )

    async def cron_schedules(self) -> list[CronSchedule]:
        """This entity's recurring schedules, the soonest next occurrence first."""
        return await self._services.cron_schedules(self.entity_url, self._activation.created)

    async def delete_cron_schedule(self, schedule_id: str) -> bool:
        """Delete a recurring schedule; False if there is none with this id."""
        check_id(schedule_id)
        act = self._activation
        return await self._services.delete_cron_schedule(self.entity_url, act.created, schedule_id)

    async def observe(self, url: str, *, wake: Subscription) -> None:
        """Subscribe to another entity: ``Wake.change(...)`` or ``Wake.run_finished()``."""
        target = parse_url(url)
        await self._check_type(target.type)
        act = self._activation
        act.add_effect(Effect(kind="subscribe", target=url, key=act.next_key(), subscribe=wake))

    def __repr__(self) -> str:
        return f"<HandlerContext {self.entity_url} wake={self.wake.kinds}>"


__all__ = [
    "CancelSignal",
    "EntityHandle",
    "Event",
    "HandlerContext",
    "Services",
    "Wake",
    "WakeInfo",
]
