"""Answering pending actions: client-routed tool calls and approvals.

The pending-actions half of :class:`~wakeful.client.Runtime`: an answer is
checked against the pending call (its schema, the caller's right to give it)
and settled at most once by the SETTLE script, so concurrent answers race
safely and one wins.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import msgspec

from .actions import (
    ActionNotAuthorizedError,
    ActionNotPendingError,
    Authorizer,
    answer_event,
    caller,
    check_answer,
    check_answerer,
    expired,
)
from .cancellation import CancelSignal
from .config import Settings
from .contracts import CallInfo
from .errors import ToolDisabledError
from .events import ActionRequested, ToolData, UserTurn, encode_event
from .registry import Registry
from .state import EntityState
from .store import Store


class PendingActions:
    """Tool calls waiting for a client's output or an approval, and their answers."""

    settings: Settings
    action_authorizer: Authorizer
    registry: Registry

    @property
    def _store(self) -> Store:
        raise NotImplementedError  # the runtime's store

    async def _folded(self, url: str) -> EntityState:
        raise NotImplementedError  # the entity's committed state

    async def pending_actions(self, url: str) -> list[ActionRequested]:
        """Tool calls of ``url`` that wait for a client's output or an approval."""
        return list((await self._folded(url)).system.actions.values())

    async def submit_tool_result(
        self, url: str, tool_call_id: str, output: Any, *, identity: dict[str, str] | None = None
    ) -> str:
        """Answer a client-routed tool call. The output is checked against the tool's
        output schema first: an invalid one is refused and the action stays pending."""
        return await self._answer(url, tool_call_id, "output", identity, output=output)

    async def fail_action(
        self, url: str, tool_call_id: str, error: str, *, identity: dict[str, str] | None = None
    ) -> str:
        return await self._answer(url, tool_call_id, "failed", identity, error=error)

    async def cancel_action(
        self, url: str, tool_call_id: str, *, identity: dict[str, str] | None = None
    ) -> str:
        return await self._answer(url, tool_call_id, "cancelled", identity, error="cancelled")

    async def skip_action(
        self,
        url: str,
        tool_call_id: str,
        reason: str | None = None,
        *,
        identity: dict[str, str] | None = None,
    ) -> str:
        """Skip a pending call (client tool or approval): it is not run, and the model
        gets a synthetic output saying so (``{"skipped": true, "reason": ...}``), which
        the registration's ``on_output`` observes, rather than an error."""
        return await self._answer(url, tool_call_id, "skipped", identity, error=reason or "skipped")

    async def approve(
        self,
        url: str,
        tool_call_id: str,
        *,
        edited_input: Any = None,
        identity: dict[str, str] | None = None,
    ) -> str:
        """Approve a call waiting for approval; ``edited_input`` replaces its input
        (checked against the tool's input schema)."""
        return await self._answer(
            url, tool_call_id, "approved", identity, edited_input=edited_input
        )

    async def deny(
        self, url: str, tool_call_id: str, reason: str, *, identity: dict[str, str] | None = None
    ) -> str:
        """Deny a call waiting for approval; the model gets ``reason`` and can act on it."""
        return await self._answer(url, tool_call_id, "denied", identity, error=reason)

    async def set_tool_data(
        self, url: str, tool_call_id: str, data: Any, *, identity: dict[str, str] | None = None
    ) -> str:
        """Set the tool data of a pending call (public per-call state renderers read).

        Checked like an answer: the call must be pending, ``identity`` allowed to answer
        it, and its tool enabled now (rechecked on every write, when this client's
        registry has the agent). It does not settle the call or wake the entity."""
        state = await self._folded(url)
        action = state.system.actions.get(tool_call_id)
        if action is None:
            await self._refuse_closed(url, tool_call_id)
            raise ActionNotPendingError(
                f"{url} has no pending action for tool call {tool_call_id!r} "
                "(unknown, or answered already): its tool data cannot be set"
            )
        if not self.action_authorizer(action, identity):
            raise ActionNotAuthorizedError(
                f"{caller(identity)} may not set the tool data of tool call "
                f"{tool_call_id!r} of {url}"
            )
        await self._check_enabled(url, action, state)
        event = encode_event(
            ToolData(
                tool_call_id=tool_call_id,
                data=msgspec.to_builtins(data),
                by=identity,
                at_ms=int(time.time() * 1000),
            ),
            limit=self.settings.max_event_bytes,
            what=f"tool data of tool call {tool_call_id!r}",
        )
        event_id = await self._store.append_tool_data(url, tool_call_id, event)
        if event_id is None:
            await self._refuse_closed(url, tool_call_id)
            raise ActionNotPendingError(f"tool call {tool_call_id!r} of {url} was answered already")
        return event_id

    async def _answer(
        self,
        url: str,
        tool_call_id: str,
        decision: str,
        identity: dict[str, str] | None,
        **fields: Any,
    ) -> str:
        state = await self._folded(url)
        action = state.system.actions.get(tool_call_id)
        if action is None:
            await self._refuse_closed(url, tool_call_id)
        # A caller who may not answer writes nothing, not even the expiry.
        check_answerer(action, url, tool_call_id, identity, self.action_authorizer)
        assert action is not None
        if expired(action):
            expiry = answer_event(tool_call_id, "expired", None, error="expired before an answer")
            await self._store.settle_action(url, tool_call_id, encode_event(expiry))
            raise ActionNotPendingError(f"tool call {tool_call_id!r} of {url} expired")
        check_answer(
            action,
            url,
            tool_call_id,
            decision,
            **{k: v for k, v in fields.items() if k in ("output", "edited_input")},
        )
        if decision in ("output", "approved"):
            await self._check_enabled(url, action, state)
        event = encode_event(
            answer_event(tool_call_id, decision, identity, **fields),
            limit=self.settings.max_event_bytes,
            what=f"answer to tool call {tool_call_id!r}",
            from_client=True,
        )
        event_id = await self._store.settle_action(url, tool_call_id, event)
        if event_id is None:
            await self._refuse_closed(url, tool_call_id)
            raise ActionNotPendingError(f"tool call {tool_call_id!r} of {url} was answered already")
        return event_id

    async def _check_enabled(self, url: str, action: ActionRequested, state: EntityState) -> None:
        """Availability is rechecked at answer time: refuse an output or an approval for
        a tool whose ``enabled`` says no now, before anything is written.

        Done here when this client's registry has the call's typed agent (as the
        worker's and ``wakeful serve APP``'s do); the run checks again in any case
        and requests the action again if it finds the tool disabled."""
        agent = self.registry.agent_named(action.agent) if action.agent else None
        registration = agent.registrations().get(action.tool) if agent else None
        if agent is None or registration is None:
            return
        enabled = registration.enabled
        if not isinstance(enabled, bool):
            identity, client_data = _caller(state, action.run_id)
            runtime_context = None
            if agent.runtime_context is not None:
                runtime_context = agent.runtime_context(identity)
                if inspect.isawaitable(runtime_context):
                    runtime_context = await runtime_context
            verdict = enabled(CallInfo(runtime_context, identity, client_data, url, CancelSignal()))
            enabled = bool(await verdict if inspect.isawaitable(verdict) else verdict)
        if not enabled:
            raise ToolDisabledError(
                f"the tool {action.tool!r} of {url} is disabled now: tool call "
                f"{action.tool_call_id!r} stays pending (it can still be cancelled, failed "
                "or skipped)"
            )

    async def _refuse_closed(self, url: str, tool_call_id: str) -> None:
        """Refuse an answer to a call whose run ended (was cancelled, failed) unanswered."""
        state = await self._store.action_state(url, tool_call_id)
        if state not in ("", "pending", "settled"):
            how = {"cancelled": "was cancelled", "failed": "failed"}.get(state, f"ended ({state})")
            raise ActionNotPendingError(
                f"tool call {tool_call_id!r} of {url} is not pending: the run {how}"
            )


def _caller(state: EntityState, run_id: str) -> tuple[dict[str, str] | None, Any]:
    """``(identity, client_data)`` of the messages the run took, latest first (what the
    run's resolvers see: ``ToolCalls.caller``)."""
    identity, client_data = None, None
    for event in reversed(state.system.history):
        if isinstance(event, UserTurn) and event.run_id == run_id:
            identity = identity or event.identity
            client_data = client_data if client_data is not None else event.client_data
    return identity, client_data
