"""Answering pending actions: client-routed tool calls and approvals.

The pending-actions half of :class:`~wakeful.client.Runtime`: an answer is
checked against the pending call (its schema, the caller's right to give it)
and settled at most once by the SETTLE script, so concurrent answers race
safely and one wins.
"""

from __future__ import annotations

from typing import Any

from .actions import (
    ActionNotPendingError,
    Authorizer,
    answer_event,
    check_answer,
    expired,
)
from .config import Settings
from .events import ActionRequested, encode_event
from .state import EntityState
from .store import Store


class PendingActions:
    """Tool calls waiting for a client's output or an approval, and their answers."""

    settings: Settings
    action_authorizer: Authorizer

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

    async def _answer(
        self,
        url: str,
        tool_call_id: str,
        decision: str,
        identity: dict[str, str] | None,
        **fields: Any,
    ) -> str:
        action = (await self._folded(url)).system.actions.get(tool_call_id)
        if action is None:
            await self._refuse_closed(url, tool_call_id)
        if action is not None and expired(action):
            expiry = answer_event(tool_call_id, "expired", None, error="expired before an answer")
            await self._store.settle_action(url, tool_call_id, encode_event(expiry))
            raise ActionNotPendingError(f"tool call {tool_call_id!r} of {url} expired")
        check_answer(
            action,
            url,
            tool_call_id,
            decision,
            identity,
            self.action_authorizer,
            **{k: v for k, v in fields.items() if k in ("output", "edited_input")},
        )
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

    async def _refuse_closed(self, url: str, tool_call_id: str) -> None:
        """Refuse an answer to a call whose run ended (was cancelled, failed) unanswered."""
        state = await self._store.action_state(url, tool_call_id)
        if state not in ("", "pending", "settled"):
            how = {"cancelled": "was cancelled", "failed": "failed"}.get(state, f"ended ({state})")
            raise ActionNotPendingError(
                f"tool call {tool_call_id!r} of {url} is not pending: the run {how}"
            )
